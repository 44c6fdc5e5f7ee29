-- Ceiling of the consumer: the statements of one turn of the inventario worker, as the
-- engine and km0 issue them, one turn per transaction of the script:
--   1. PgSubscription::poll: the FETCH of up to :batch records of the held partitions
--      (crates/entrega-postgres/src/log/subscription.rs);
--   2. StockStore::apply_batch on PostgreSQL, per event (BatchMode::PerEvent): one
--      transaction, and per message one statement that checks its idempotency key, its
--      order's reservation and every line, then claims the key, takes the units, records the
--      reservation and writes one stock.actualizado per product, only if all can be served
--      (km0/src/services/inventario/pg_batch.rs);
--   3. the offset commit, fenced by the partition leases (log/leases.rs).
-- Per message that is one round trip; per batch four more (poll, begin, commit, and the
-- offset commit).
--
-- The section between the @each-message markers is written once per message of a full batch
-- by `km0 bench consume`, its placeholders replaced by the message number and its two
-- products (as in the bench's orders), each copy guarded by the number of records polled.
--
-- Differences from the engine, all in the ceiling's favour or neutral:
--   * the poll's rows come back with their count and the next read positions attached
--     (window functions, \aset) instead of being decoded in Rust;
--   * keys are sequential ids of the same length as a UUID rather than the events' random
--     ids, and message k takes products k and k + 1 as order k of the data does, without
--     parsing the payload;
--   * the log and the stock share one database and one connection;
--   * the offset commit stamps clock_timestamp() instead of a bound epoch-ms parameter, and
--     commits all six partitions.
--
-- `km0 bench consume` also runs the script pipelined: the @pipeline markers below become
-- \startpipeline and \endpipeline, so the batch transaction's statements go out without
-- waiting for each reply. Same statements, same database work, one round trip's latency
-- instead of one per statement: the difference between the two is the network's share.
--
-- Variables (-D): batch, consumer, p0..p4 (the products), o0..o5=0 (read positions), id=0.
\set n 0
\set q 1
SELECT f.partition_no, f.log_offset, f.msg_key, f.headers, f.payload, f.appended_at_ms,
       count(*) OVER () AS n,
       coalesce(max(f.log_offset) FILTER (WHERE f.partition_no = 0) OVER () + 1, :o0) AS o0,
       coalesce(max(f.log_offset) FILTER (WHERE f.partition_no = 1) OVER () + 1, :o1) AS o1,
       coalesce(max(f.log_offset) FILTER (WHERE f.partition_no = 2) OVER () + 1, :o2) AS o2,
       coalesce(max(f.log_offset) FILTER (WHERE f.partition_no = 3) OVER () + 1, :o3) AS o3,
       coalesce(max(f.log_offset) FILTER (WHERE f.partition_no = 4) OVER () + 1, :o4) AS o4,
       coalesce(max(f.log_offset) FILTER (WHERE f.partition_no = 5) OVER () + 1, :o5) AS o5
FROM (
    -- PgSubscription::poll (FETCH)
    SELECT r.partition_no, r.log_offset, r.msg_key, r.headers, r.payload, r.appended_at_ms
    FROM UNNEST('{0,1,2,3,4,5}'::int4[], ARRAY[:o0, :o1, :o2, :o3, :o4, :o5]::int8[]) AS c(p, o)
    CROSS JOIN LATERAL (
        SELECT l.partition_no, l.log_offset, l.msg_key, l.headers, l.payload, l.appended_at_ms,
               l.log_offset - c.o AS distance
        FROM entrega_log l
        WHERE l.topic = 'pedidos.eventos' AND l.partition_no = c.p AND l.log_offset >= c.o
        ORDER BY l.log_offset
        LIMIT :batch
    ) r
    ORDER BY r.distance, r.partition_no
    LIMIT :batch
) f \aset
-- @pipeline-start
\if :n > 0
BEGIN;
\endif
-- @each-message
\if :n >= @K@
\set id :id + 1
WITH lines AS (
    SELECT producto, sum(cantidad)::int4 AS cantidad, min(ord) AS ord
    FROM UNNEST(ARRAY[:p@A@, :p@B@]::text[], ARRAY[:q, :q]::int4[])
         WITH ORDINALITY AS l(producto, cantidad, ord)
    GROUP BY producto
), dup AS (
    SELECT 1 FROM mensajes_procesados
    WHERE id_mensaje = '00000000-0000-4000-8000-' || lpad(:id, 12, '0') AND consumidor = :consumer
), held AS (
    SELECT 1 FROM reservas WHERE id_reserva = 'reserva-P-bench-' || lpad(:id, 6, '0')
), short AS (
    SELECT l.producto, s.producto IS NULL AS unknown
    FROM lines l LEFT JOIN stock s ON s.producto = l.producto
    WHERE (s.producto IS NULL OR s.unidades < l.cantidad) AND NOT EXISTS (SELECT 1 FROM held)
    ORDER BY l.ord
    LIMIT 1
), claim AS (
    INSERT INTO mensajes_procesados (id_mensaje, consumidor)
    SELECT '00000000-0000-4000-8000-' || lpad(:id, 12, '0'), :consumer
    WHERE NOT EXISTS (SELECT 1 FROM dup) AND NOT EXISTS (SELECT 1 FROM short)
    ON CONFLICT DO NOTHING
    RETURNING 1
), taken AS (
    UPDATE stock s SET unidades = s.unidades - l.cantidad
    FROM lines l
    WHERE s.producto = l.producto AND EXISTS (SELECT 1 FROM claim)
      AND NOT EXISTS (SELECT 1 FROM held)
    RETURNING s.producto, s.unidades, l.cantidad, l.ord
), reserved AS (
    INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms)
    SELECT 'reserva-P-bench-' || lpad(:id, 6, '0'), 'P-bench-' || lpad(:id, 6, '0'), 'reservada',
           jsonb_build_array(jsonb_build_object('producto', :p@A@::text, 'cantidad', :q::int4),
                             jsonb_build_object('producto', :p@B@::text, 'cantidad', :q::int4))::text,
           NULL, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    WHERE EXISTS (SELECT 1 FROM taken)
    RETURNING 1
), updated AS (
    INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
    SELECT gen_random_uuid(), 'producto', t.producto, 'stock.actualizado',
           jsonb_build_object('producto', t.producto, 'antes', t.unidades + t.cantidad,
                              'despues', t.unidades, 'motivo', 'pedido',
                              'pedido_id', 'P-bench-' || lpad(:id, 6, '0'))
    FROM taken t ORDER BY t.ord
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM dup) AS duplicate,
       (SELECT producto FROM short) AS short_product,
       COALESCE((SELECT unknown FROM short), false) AS unknown,
       (SELECT count(*) FROM claim) AS claimed,
       (SELECT count(*) FROM taken) AS taken,
       EXISTS (SELECT 1 FROM held) AS held;
\endif
-- @end-each-message
\if :n > 0
COMMIT;
\endif
-- @pipeline-end
\if :n > 0
-- commit_offsets (log/leases.rs): one statement, the lease rows read FOR SHARE
WITH wanted AS (
    SELECT * FROM UNNEST('{0,1,2,3,4,5}'::int4[], ARRAY[:o0, :o1, :o2, :o3, :o4, :o5]::int8[],
                         '{1,1,1,1,1,1}'::int8[]) AS c(p, o, token)
), held AS (
    SELECT partition_no, token FROM entrega_partition_leases
    WHERE group_id = 'inventario' AND topic = 'pedidos.eventos' AND owner = 'pgbench-0'
      AND partition_no = ANY('{0,1,2,3,4,5}'::int4[])
    FOR SHARE
), lost AS (
    SELECT w.p FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.partition_no = w.p AND h.token = w.token)
), written AS (
    INSERT INTO entrega_group_offsets (group_id, topic, partition_no, next_offset, committed_at_ms)
    SELECT 'inventario', 'pedidos.eventos', w.p, w.o,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM lost)
    ON CONFLICT (group_id, topic, partition_no)
    DO UPDATE SET next_offset = EXCLUDED.next_offset, committed_at_ms = EXCLUDED.committed_at_ms
    RETURNING 1
)
SELECT min(p) FROM lost;
\else
-- The topic is drained: idle until the run is stopped.
\sleep 20 ms
\endif
