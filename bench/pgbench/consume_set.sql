-- Ceiling of the consumer's set-based batch apply: the statements of one turn of the
-- inventario worker, as the engine and km0 issue them, one turn per transaction of the script:
--   1. PgSubscription::poll: the FETCH of up to :batch records of the held partitions
--      (crates/entrega-postgres/src/log/subscription.rs);
--   2. StockStore::apply_batch, set-based (km0/src/services/inventario/set_batch.rs): one
--      transaction of six statements whatever the batch size: every key claimed at once
--      (Tx::claim_all), the batch's existing reservations read, its products' stock rows
--      locked, each product's stock written once, the reservations inserted, and one
--      stock.actualizado per product of each order written to the outbox;
--   3. the offset commit, fenced by the partition leases (log/leases.rs).
-- Per batch that is nine round trips (poll, begin, the six, commit) and the offset commit.
--
-- Differences from the engine, all in the ceiling's favour or neutral:
--   * the poll's rows come back with their count and the next read positions attached
--     (window functions, \aset) instead of being decoded in Rust;
--   * the batch's keys, orders and products are generated in the server from the message
--     numbers (keys are sequential ids of the same length as a UUID, message k of a batch
--     takes products k and k + 1 as order k of the data does, every order distinct), where
--     the engine parses the payloads, decides each event in Rust and binds arrays;
--   * the outbox ids come from gen_random_uuid() instead of being bound;
--   * the log and the stock share one database and one connection;
--   * the offset commit stamps clock_timestamp() instead of a bound epoch-ms parameter, and
--     commits all six partitions.
--
-- `km0 bench consume` also runs the script pipelined: the @pipeline markers below become
-- \startpipeline and \endpipeline, so the batch transaction's statements go out without
-- waiting for each reply.
--
-- Variables (-D): batch, consumer, p0..p4 (the products), o0..o5=0 (read positions), id=0.
-- @poll: the poll of consume.sql, unchanged
-- @pipeline-start
\if :n > 0
BEGIN;
-- Tx::claim_all
INSERT INTO mensajes_procesados (id_mensaje, consumidor)
SELECT DISTINCT k.id, :consumer
FROM UNNEST(ARRAY(SELECT '00000000-0000-4000-8000-' || lpad((:id + g)::text, 12, '0')
                  FROM generate_series(1, :n) g)) AS k(id)
ORDER BY k.id
ON CONFLICT DO NOTHING
RETURNING id_mensaje;
-- the reservations that exist for the batch's orders
SELECT id_reserva FROM reservas
WHERE id_reserva = ANY(ARRAY(SELECT 'reserva-P-bench-' || lpad((:id + g)::text, 6, '0')
                             FROM generate_series(1, :n) g));
-- the batch's products, locked until the commit
SELECT producto, unidades::int8 FROM stock
WHERE producto = ANY(ARRAY[:p0, :p1, :p2, :p3, :p4]::text[])
ORDER BY producto FOR UPDATE;
-- each product's stock, once
UPDATE stock s SET unidades = s.unidades - t.n
FROM (
    SELECT p, count(*)::int8 AS n
    FROM generate_series(1, :n) g
    CROSS JOIN LATERAL (VALUES (g % 5), ((g + 1) % 5)) AS l(i)
    CROSS JOIN LATERAL (SELECT (ARRAY[:p0, :p1, :p2, :p3, :p4]::text[])[l.i + 1] AS p) x
    GROUP BY p
) t
WHERE s.producto = t.p;
-- the orders' reservations
INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms)
SELECT 'reserva-P-bench-' || lpad((:id + g)::text, 6, '0'),
       'P-bench-' || lpad((:id + g)::text, 6, '0'), 'reservada',
       jsonb_build_array(
           jsonb_build_object('producto', (ARRAY[:p0, :p1, :p2, :p3, :p4]::text[])[g % 5 + 1],
                              'cantidad', 1),
           jsonb_build_object('producto', (ARRAY[:p0, :p1, :p2, :p3, :p4]::text[])[(g + 1) % 5 + 1],
                              'cantidad', 1))::text,
       NULL, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM generate_series(1, :n) g;
-- Tx::enqueue_all: one stock.actualizado per product of each order, in order
INSERT INTO outbox (id, agregado, agregado_id, tipo, version, carga)
SELECT gen_random_uuid(), 'producto', x.p, 'stock.actualizado', 1,
       jsonb_build_object('producto', x.p, 'antes', 1000000000 - g, 'despues', 999999999 - g,
                          'motivo', 'pedido',
                          'pedido_id', 'P-bench-' || lpad((:id + g)::text, 6, '0'))
FROM generate_series(1, :n) g
CROSS JOIN LATERAL (VALUES (1, g % 5), (2, (g + 1) % 5)) AS l(o, i)
CROSS JOIN LATERAL (SELECT (ARRAY[:p0, :p1, :p2, :p3, :p4]::text[])[l.i + 1] AS p) x
ORDER BY g, l.o;
COMMIT;
\set id :id + :n
\endif
-- @pipeline-end
-- @offset-commit: the offset commit of consume.sql, unchanged
