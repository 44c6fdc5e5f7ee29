"""pedidos' outbox relay, written the way the seed writes it: SELECT ... FOR UPDATE SKIP
LOCKED, produce with key = agregado_id and headers tipo/id_evento, flush, then UPDATE
publicado_en, all in one transaction per batch.

As a script it first creates --orders N orders (seed_producer.py, those not there yet),
then relays until the outbox has no pending rows, and exits 0. With --crash-before-mark it
dies (status 3) right after the first flush, before marking: the events are on the topic
and still pending in the outbox, so the next run publishes them again (same id_evento).
The last line on stdout is a JSON object with the counts.
"""

import argparse
import json
import os
import sys
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from seed_producer import crear_pedidos, crear_tablas

LOTE = 100
SALIDA_CAIDA = 3


class EntregaFallida(Exception):
    """The broker did not confirm every message of a batch."""


def asegurar_topico(bootstrap: str, topico: str, particiones: int, timeout: float) -> None:
    """Creates the topic if missing (the seed assumes it exists, with six partitions)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futuro = admin.create_topics([NewTopic(topico, num_partitions=particiones,
                                           replication_factor=1)],
                                 operation_timeout=timeout)[topico]
    try:
        futuro.result(timeout=timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def publicar_pendientes(conn: psycopg.Connection, productor: Producer, topico: str,
                        caer_antes_de_marcar: bool, timeout: float) -> int:
    """Publishes one batch of pending rows; returns how many."""
    errores: list[str] = []

    def al_entregar(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errores.append(str(err))

    with conn.transaction():
        with conn.cursor() as cur:
            cur.execute(
                "SELECT id, agregado_id, tipo, version, carga, creado_en FROM outbox "
                "WHERE publicado_en IS NULL ORDER BY creado_en "
                "LIMIT %s FOR UPDATE SKIP LOCKED", (LOTE,))
            filas = cur.fetchall()
            for id_evento, agregado_id, tipo, version, carga, creado_en in filas:
                envoltura = {"id_evento": str(id_evento), "tipo": tipo, "version": version,
                             "fecha_ms": int(creado_en.timestamp() * 1000),
                             "origen": "pedidos", "datos": carga}
                productor.produce(topico, key=agregado_id, value=json.dumps(envoltura).encode(),
                                  headers=[("tipo", tipo), ("id_evento", str(id_evento))],
                                  on_delivery=al_entregar)
            # Waits for the broker's confirmation. Unlike the seed, a message the broker
            # refused (or that timed out) rolls the batch back instead of marking it.
            sin_confirmar = productor.flush(timeout)
            if sin_confirmar or errores:
                raise EntregaFallida(f"{sin_confirmar} sin confirmar, errores: {errores[:3]}")
            if filas and caer_antes_de_marcar:
                print(f"[relay] publicados {len(filas)} eventos; muero antes de marcarlos",
                      file=sys.stderr, flush=True)
                os._exit(SALIDA_CAIDA)  # no ROLLBACK, no cleanup: as a crash would
            if filas:
                cur.execute("UPDATE outbox SET publicado_en = now() WHERE id = ANY(%s)",
                            ([f[0] for f in filas],))
    return len(filas)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--dsn", required=True)
    p.add_argument("--topic", default="pedidos.eventos")
    p.add_argument("--orders", type=int, default=0, help="orders to create before relaying")
    p.add_argument("--id-prefix", default="P-2026-")
    p.add_argument("--partitions", type=int, default=6, help="if the topic must be created")
    p.add_argument("--crash-before-mark", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per broker wait")
    p.add_argument("--as-written", action="store_true",
                   help="the seed's producer settings, unchanged (benchmarks); without it, "
                        "deliveries time out after --timeout, as tests need")
    args = p.parse_args()

    ajustes = {"bootstrap.servers": args.bootstrap, "acks": "all"}
    if not args.as_written:
        ajustes["message.timeout.ms"] = int(args.timeout * 1000)
    productor = Producer(ajustes)
    asegurar_topico(args.bootstrap, args.topic, args.partitions, args.timeout)
    publicados = 0
    with psycopg.connect(args.dsn) as conn:
        crear_tablas(conn)
        creados = crear_pedidos(conn, args.orders, args.id_prefix)
        while (n := publicar_pendientes(conn, productor, args.topic,
                                        args.crash_before_mark, args.timeout)) > 0:
            publicados += n
            print(f"[relay] publicados {n} eventos", file=sys.stderr)
    print(json.dumps({"created": creados, "published": publicados}), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (EntregaFallida, KafkaException, psycopg.Error) as e:
        print(f"[relay] {e}", file=sys.stderr)
        sys.exit(1)
