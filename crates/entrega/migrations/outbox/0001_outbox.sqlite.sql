-- The seed's outbox, in SQLite types: id is the hyphenated UUID (id_evento), carga is JSON
-- text, times are UTC text in the column default's format. `lane` is entrega's addition: it
-- defaults to 0 so the seed's INSERT still works (and is added separately when adopting a
-- table created from the seed's own SQL). The publishing sequence is the table's rowid.
CREATE TABLE IF NOT EXISTS outbox (
    id           TEXT    PRIMARY KEY,
    agregado     TEXT    NOT NULL,
    agregado_id  TEXT    NOT NULL,
    tipo         TEXT    NOT NULL,
    version      INTEGER NOT NULL DEFAULT 1,
    carga        TEXT    NOT NULL,
    creado_en    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    publicado_en TEXT,
    lane         INTEGER NOT NULL DEFAULT 0
);
