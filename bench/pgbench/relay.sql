-- Ceiling of the relay: the statements of one relay round as entrega-postgres issues them
-- (crates/entrega-postgres/src/outbox_lanes.rs, log/publish.rs), one round per script run.
--
-- Client c holds the lanes l with l % :nclients = c, as :nclients relays share them after
-- balancing, and drains them like Relay::drain_once: read up to :batch pending rows of every
-- held lane in one query, append them to the log in one transaction (one statement per
-- partition), then mark them published in one statement fenced by each lane's lease.
--
-- Same statements, same tables and indexes, same rows written, same round trips and commits
-- as the engine; what differs is in the ceiling's favour:
--   * the rows stay in the server: the client gets their ids (grouped by partition), and
--     each append reads its rows back by primary key and builds the envelope bytes there,
--     where the engine ships the rows to Rust and the envelopes back;
--   * a row's partition is a hash of agregado_id (not Kafka's murmur2): same spread, same
--     number of appends per round;
--   * every round reads all of the client's lanes (the engine reads only lanes that filled
--     their batch in the round before, within one pass);
--   * the outbox and the log share one database and one connection;
--   * timestamps come from clock_timestamp() instead of bound epoch-ms parameters.
--
-- Variables (-D): batch, nclients.
SELECT count(*) AS n,
       coalesce(array_agg(id ORDER BY lane, seq), '{}') AS ids,
       count(*) FILTER (WHERE part = 0) AS n0,
       coalesce(array_agg(id ORDER BY lane, seq) FILTER (WHERE part = 0), '{}') AS ids0,
       count(*) FILTER (WHERE part = 1) AS n1,
       coalesce(array_agg(id ORDER BY lane, seq) FILTER (WHERE part = 1), '{}') AS ids1,
       count(*) FILTER (WHERE part = 2) AS n2,
       coalesce(array_agg(id ORDER BY lane, seq) FILTER (WHERE part = 2), '{}') AS ids2,
       count(*) FILTER (WHERE part = 3) AS n3,
       coalesce(array_agg(id ORDER BY lane, seq) FILTER (WHERE part = 3), '{}') AS ids3,
       count(*) FILTER (WHERE part = 4) AS n4,
       coalesce(array_agg(id ORDER BY lane, seq) FILTER (WHERE part = 4), '{}') AS ids4,
       count(*) FILTER (WHERE part = 5) AS n5,
       coalesce(array_agg(id ORDER BY lane, seq) FILTER (WHERE part = 5), '{}') AS ids5
FROM (
    SELECT r.id, r.lane, r.seq, (hashtext(r.agregado_id || '#') & 2147483647) % 6 AS part
    FROM (
        -- OutboxReader::pending_lanes
        SELECT o.lane, o.id, o.agregado, o.agregado_id, o.tipo, o.version, o.carga, o.seq,
               (extract(epoch FROM o.creado_en) * 1000)::bigint AS created_at_ms
        FROM UNNEST(ARRAY(SELECT generate_series(:client_id, 63, :nclients))::int2[],
                    ARRAY(SELECT (-9223372036854775807 - 1)::int8
                          FROM generate_series(:client_id, 63, :nclients)))
             WITH ORDINALITY AS h(lane, after_seq, ord)
        CROSS JOIN LATERAL (
            SELECT lane, id, agregado, agregado_id, tipo, version, carga, seq, creado_en
            FROM outbox
            WHERE lane = h.lane AND publicado_en IS NULL AND seq > h.after_seq
            ORDER BY seq
            LIMIT :batch
        ) o
        ORDER BY h.ord, o.seq
    ) r
) m \gset
\if :n > 0
BEGIN;
\if :n0 > 0
-- PgLog::publish, the append of partition 0
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + :n0
    WHERE topic = 'pedidos.eventos' AND partition_no = 0
    RETURNING next_offset - :n0 AS base, pg_notify('entrega_log', 'pedidos.eventos') AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT 'pedidos.eventos', 0, p.base + m.ord - 1, m.k, m.h, m.b,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM p, (
        SELECT u.ord, o.agregado_id AS k,
               '[["tipo","' || o.tipo || '"],["id_evento","' || o.id || '"]]' AS h,
               convert_to('{"id_evento":"' || o.id || '","tipo":"' || o.tipo || '","version":'
                          || o.version || ',"fecha_ms":'
                          || (extract(epoch FROM o.creado_en) * 1000)::bigint
                          || ',"origen":"pedidos","datos":' || o.carga::text || '}', 'UTF8') AS b
        FROM UNNEST(:ids0::uuid[]) WITH ORDINALITY AS u(id, ord)
        JOIN outbox o ON o.id = u.id
    ) m
    RETURNING 1
)
SELECT count(*) FROM ins;
\endif
\if :n1 > 0
-- PgLog::publish, the append of partition 1
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + :n1
    WHERE topic = 'pedidos.eventos' AND partition_no = 1
    RETURNING next_offset - :n1 AS base, pg_notify('entrega_log', 'pedidos.eventos') AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT 'pedidos.eventos', 1, p.base + m.ord - 1, m.k, m.h, m.b,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM p, (
        SELECT u.ord, o.agregado_id AS k,
               '[["tipo","' || o.tipo || '"],["id_evento","' || o.id || '"]]' AS h,
               convert_to('{"id_evento":"' || o.id || '","tipo":"' || o.tipo || '","version":'
                          || o.version || ',"fecha_ms":'
                          || (extract(epoch FROM o.creado_en) * 1000)::bigint
                          || ',"origen":"pedidos","datos":' || o.carga::text || '}', 'UTF8') AS b
        FROM UNNEST(:ids1::uuid[]) WITH ORDINALITY AS u(id, ord)
        JOIN outbox o ON o.id = u.id
    ) m
    RETURNING 1
)
SELECT count(*) FROM ins;
\endif
\if :n2 > 0
-- PgLog::publish, the append of partition 2
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + :n2
    WHERE topic = 'pedidos.eventos' AND partition_no = 2
    RETURNING next_offset - :n2 AS base, pg_notify('entrega_log', 'pedidos.eventos') AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT 'pedidos.eventos', 2, p.base + m.ord - 1, m.k, m.h, m.b,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM p, (
        SELECT u.ord, o.agregado_id AS k,
               '[["tipo","' || o.tipo || '"],["id_evento","' || o.id || '"]]' AS h,
               convert_to('{"id_evento":"' || o.id || '","tipo":"' || o.tipo || '","version":'
                          || o.version || ',"fecha_ms":'
                          || (extract(epoch FROM o.creado_en) * 1000)::bigint
                          || ',"origen":"pedidos","datos":' || o.carga::text || '}', 'UTF8') AS b
        FROM UNNEST(:ids2::uuid[]) WITH ORDINALITY AS u(id, ord)
        JOIN outbox o ON o.id = u.id
    ) m
    RETURNING 1
)
SELECT count(*) FROM ins;
\endif
\if :n3 > 0
-- PgLog::publish, the append of partition 3
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + :n3
    WHERE topic = 'pedidos.eventos' AND partition_no = 3
    RETURNING next_offset - :n3 AS base, pg_notify('entrega_log', 'pedidos.eventos') AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT 'pedidos.eventos', 3, p.base + m.ord - 1, m.k, m.h, m.b,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM p, (
        SELECT u.ord, o.agregado_id AS k,
               '[["tipo","' || o.tipo || '"],["id_evento","' || o.id || '"]]' AS h,
               convert_to('{"id_evento":"' || o.id || '","tipo":"' || o.tipo || '","version":'
                          || o.version || ',"fecha_ms":'
                          || (extract(epoch FROM o.creado_en) * 1000)::bigint
                          || ',"origen":"pedidos","datos":' || o.carga::text || '}', 'UTF8') AS b
        FROM UNNEST(:ids3::uuid[]) WITH ORDINALITY AS u(id, ord)
        JOIN outbox o ON o.id = u.id
    ) m
    RETURNING 1
)
SELECT count(*) FROM ins;
\endif
\if :n4 > 0
-- PgLog::publish, the append of partition 4
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + :n4
    WHERE topic = 'pedidos.eventos' AND partition_no = 4
    RETURNING next_offset - :n4 AS base, pg_notify('entrega_log', 'pedidos.eventos') AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT 'pedidos.eventos', 4, p.base + m.ord - 1, m.k, m.h, m.b,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM p, (
        SELECT u.ord, o.agregado_id AS k,
               '[["tipo","' || o.tipo || '"],["id_evento","' || o.id || '"]]' AS h,
               convert_to('{"id_evento":"' || o.id || '","tipo":"' || o.tipo || '","version":'
                          || o.version || ',"fecha_ms":'
                          || (extract(epoch FROM o.creado_en) * 1000)::bigint
                          || ',"origen":"pedidos","datos":' || o.carga::text || '}', 'UTF8') AS b
        FROM UNNEST(:ids4::uuid[]) WITH ORDINALITY AS u(id, ord)
        JOIN outbox o ON o.id = u.id
    ) m
    RETURNING 1
)
SELECT count(*) FROM ins;
\endif
\if :n5 > 0
-- PgLog::publish, the append of partition 5
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + :n5
    WHERE topic = 'pedidos.eventos' AND partition_no = 5
    RETURNING next_offset - :n5 AS base, pg_notify('entrega_log', 'pedidos.eventos') AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT 'pedidos.eventos', 5, p.base + m.ord - 1, m.k, m.h, m.b,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM p, (
        SELECT u.ord, o.agregado_id AS k,
               '[["tipo","' || o.tipo || '"],["id_evento","' || o.id || '"]]' AS h,
               convert_to('{"id_evento":"' || o.id || '","tipo":"' || o.tipo || '","version":'
                          || o.version || ',"fecha_ms":'
                          || (extract(epoch FROM o.creado_en) * 1000)::bigint
                          || ',"origen":"pedidos","datos":' || o.carga::text || '}', 'UTF8') AS b
        FROM UNNEST(:ids5::uuid[]) WITH ORDINALITY AS u(id, ord)
        JOIN outbox o ON o.id = u.id
    ) m
    RETURNING 1
)
SELECT count(*) FROM ins;
\endif
COMMIT;
-- OutboxReader::mark_published_lanes: every lane fenced by its own lease, one statement
WITH held AS (
    SELECT l.lane
    FROM entrega_relay_lanes l
    JOIN (SELECT g AS lane, 'pgbench-' || :client_id AS owner, 1::int8 AS token
          FROM generate_series(:client_id, 63, :nclients) AS g) AS m
      ON m.lane = l.lane AND m.owner = l.owner AND m.token = l.token
), marked AS (
    UPDATE outbox SET publicado_en = clock_timestamp()
    WHERE id = ANY(:ids::uuid[]) AND publicado_en IS NULL
      AND lane = ANY(ARRAY(SELECT lane::int2 FROM held))
    RETURNING 1
)
SELECT lane FROM held;
\else
-- Every lane of this client is drained: idle until the run is stopped.
\sleep 20 ms
\endif
