-- Ceiling of the relay when the events go to Kafka: the statements of one relay round that
-- reach the database, as entrega-postgres issues them (crates/entrega-postgres/src/
-- outbox_lanes.rs), one round per script run. The publish goes to the cluster, not here.
--
-- Client c holds the lanes l with l % :nclients = c, as :nclients relays share them after
-- balancing, and drains them like Relay::round: read up to :batch pending rows of every held
-- lane in one query, every column shipped to the client (the relay builds each message from
-- them), then mark them published in one statement fenced by each lane's lease.
--
-- Same statements, tables, indexes and rows as the engine; what differs is in the ceiling's
-- favour:
--   * the rows come back folded into one text value (pgbench keeps one row of a result), and
--     are never decoded, let alone turned into messages;
--   * every round reads all of the client's lanes (the engine reads only lanes that filled
--     their batch in the round before, within one pass);
--   * the mark stamps clock_timestamp() instead of a bound epoch-ms parameter.
--
-- Variables (-D): batch, nclients.
SELECT count(*) AS n,
       coalesce(array_agg(id ORDER BY ord, seq), '{}') AS ids,
       coalesce(string_agg(concat_ws(' ', lane, id, agregado, agregado_id, tipo, version,
                                     carga::text, created_at_ms), E'\n' ORDER BY ord, seq),
                '') AS fetched
FROM (
    -- OutboxReader::pending_lanes
    SELECT h.ord, o.lane, o.id, o.agregado, o.agregado_id, o.tipo, o.version, o.carga, o.seq,
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
) r \gset
\if :n > 0
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
