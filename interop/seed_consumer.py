"""inventario's idempotent consumer, written the way the seed writes it (confluent_kafka +
psycopg 3), reading pedidos.eventos and taking stock once per id_evento.

The idempotency key and the stock UPDATEs share one transaction; the Kafka offset is
committed only after that transaction. Every message is checked against the envelope
contract first (envoltura.py).

Exit status: 0 once --expect distinct pedido.creado events are applied (now or earlier),
1 on timeout, 2 on a message that is not a valid envelope, 3 when stock runs out. The last
line on stdout is a JSON object with the counts.
"""

import argparse
import json
import sys
import time
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError

from envoltura import EnvolturaInvalida, validar

CONSUMIDOR = "inventario.descuento_stock"

ESQUEMA = """
CREATE TABLE IF NOT EXISTS stock (
    producto TEXT PRIMARY KEY,
    unidades INTEGER NOT NULL CHECK (unidades >= 0)
);
INSERT INTO stock VALUES ('tomate-rosa', 120), ('calabacin', 80), ('queso-curado', 5),
                         ('queso-fresco', 30), ('vino-crianza', 200)
    ON CONFLICT (producto) DO NOTHING;
CREATE TABLE IF NOT EXISTS mensajes_procesados (
    id_mensaje   TEXT        NOT NULL,
    consumidor   TEXT        NOT NULL,
    procesado_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id_mensaje, consumidor)
);
"""

SALIDA_TIEMPO, SALIDA_INVALIDO, SALIDA_SIN_STOCK = 1, 2, 3


class StockInsuficiente(Exception):
    pass


def crear_tablas(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute(ESQUEMA)


def procesar_pedido_creado(conn: psycopg.Connection, evento: dict[str, Any],
                           consumidor: str) -> str:
    """'procesado' or 'duplicado'; StockInsuficiente rolls back the key with the stock."""
    with conn.transaction():
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO mensajes_procesados (id_mensaje, consumidor) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING RETURNING id_mensaje",
                (evento["id_evento"], consumidor))
            if cur.fetchone() is None:
                return "duplicado"
            for linea in evento["datos"]["lineas"]:
                cur.execute(
                    "UPDATE stock SET unidades = unidades - %s "
                    "WHERE producto = %s AND unidades >= %s",
                    (linea["cantidad"], linea["producto"], linea["cantidad"]))
                if cur.rowcount == 0:
                    raise StockInsuficiente(f"sin stock de {linea['producto']}")
    return "procesado"


def argumentos() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--dsn", required=True)
    p.add_argument("--topic", default="pedidos.eventos")
    p.add_argument("--group", default="inventario")
    p.add_argument("--consumidor", default=CONSUMIDOR,
                   help="value of mensajes_procesados.consumidor")
    p.add_argument("--expect", type=int, required=True,
                   help="distinct pedido.creado events to apply before exiting")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds")
    p.add_argument("--as-written", action="store_true",
                   help="the seed's consumer settings and its asynchronous commit, unchanged "
                        "(benchmarks); without it, a short session and synchronous commits "
                        "that tests can rely on")
    return p.parse_args()


def consumir(args: argparse.Namespace, conn: psycopg.Connection,
             cuentas: dict[str, int]) -> int:
    ajustes = {
        "bootstrap.servers": args.bootstrap, "group.id": args.group,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    }
    if not args.as_written:
        ajustes.update({
            # A dead member of a test's group is noticed after this; keep it short.
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
            # The topic may be created after we subscribe: look for it again soon.
            "topic.metadata.refresh.interval.ms": 1000,
        })
    consumidor = Consumer(ajustes)
    consumidor.subscribe([args.topic])
    vistos: set[str] = set()
    fin = time.monotonic() + args.timeout
    try:
        while len(vistos) < args.expect:
            if time.monotonic() > fin:
                print(f"[inventario] tiempo agotado con {len(vistos)} de {args.expect}",
                      file=sys.stderr)
                return SALIDA_TIEMPO
            msg = consumidor.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    print("[inventario] error de Kafka:", msg.error(), file=sys.stderr)
                continue
            try:
                evento = validar(msg.value(), msg.key(), msg.headers())
            except EnvolturaInvalida as e:
                # Not committed: the message stays where an operator can read it.
                cuentas["invalidos"] += 1
                print(f"[inventario] envoltura inválida en {msg.topic()}[{msg.partition()}]"
                      f"@{msg.offset()}: {e}", file=sys.stderr)
                return SALIDA_INVALIDO
            if evento["tipo"] == "pedido.creado":
                try:
                    resultado = procesar_pedido_creado(conn, evento, args.consumidor)
                except StockInsuficiente as e:
                    print(f"[inventario] {evento['id_evento']}: {e}", file=sys.stderr)
                    return SALIDA_SIN_STOCK
                cuentas["procesados" if resultado == "procesado" else "duplicados"] += 1
                vistos.add(evento["id_evento"])
                print(f"[inventario] {evento['id_evento'][:8]} pedido "
                      f"{evento['datos']['id']}: {resultado}", file=sys.stderr)
            else:
                cuentas["ignorados"] += 1
            # Always after the database transaction. As the seed writes it, asynchronous;
            # synchronous for tests, since we may exit next.
            if args.as_written:
                consumidor.commit(message=msg)
            else:
                consumidor.commit(message=msg, asynchronous=False)
        return 0
    finally:
        cuentas["distintos"] = len(vistos)
        consumidor.close()


def main() -> int:
    args = argumentos()
    cuentas = {"procesados": 0, "duplicados": 0, "invalidos": 0, "ignorados": 0,
               "distintos": 0}
    with psycopg.connect(args.dsn) as conn:
        crear_tablas(conn)
        salida = consumir(args, conn, cuentas)
    print(json.dumps({"processed": cuentas["procesados"], "duplicates": cuentas["duplicados"],
                      "invalid": cuentas["invalidos"], "ignored": cuentas["ignorados"],
                      "distinct": cuentas["distintos"], "exit": salida}), flush=True)
    return salida


if __name__ == "__main__":
    sys.exit(main())
