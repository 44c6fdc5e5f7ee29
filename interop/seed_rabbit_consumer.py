"""inventario's queue on RabbitMQ, declared and consumed the way the seed's section 6 writes it
(pika): exchange km0.dlx (direct), queue inventario.pedidos.dlq bound to it with key
inventario.pedidos, and queue inventario.pedidos with x-dead-letter-exchange=km0.dlx and
x-dead-letter-routing-key=inventario.pedidos. A message that is not a valid envelope is a
permanent error: basic_nack(requeue=False), and the broker moves it to the dead-letter queue.
A valid one is acked after it was read.

With --declare-only it declares and exits. Otherwise it consumes until --expect valid events
and --poison rejected ones were seen, or --timeout seconds passed (exit 1). The last line on
stdout is a JSON object: {"ids": [...valid id_evento...], "rejected": n}.

On RabbitMQ the partitioning key (agregado_id) travels in the header entrega-key.
"""

import argparse
import json
import sys
import time

import pika

from envoltura import EnvolturaInvalida, validar


def declarar(canal) -> None:
    # RabbitMQ: cola con DLQ nativa (the seed's declarations, unchanged).
    canal.exchange_declare(exchange="km0.dlx", exchange_type="direct", durable=True)
    canal.queue_declare(queue="inventario.pedidos.dlq", durable=True)
    canal.queue_bind(queue="inventario.pedidos.dlq", exchange="km0.dlx", routing_key="inventario.pedidos")
    canal.queue_declare(queue="inventario.pedidos", durable=True, arguments={
        "x-dead-letter-exchange": "km0.dlx",
        "x-dead-letter-routing-key": "inventario.pedidos",
    })


def cabeceras(props) -> list[tuple[str, bytes | None]]:
    salida = []
    for nombre, valor in (props.headers or {}).items():
        if isinstance(valor, bytes):
            salida.append((nombre, valor))
        elif valor is not None:
            salida.append((nombre, str(valor).encode("utf-8")))
    return salida


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--declare-only", action="store_true")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--poison", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()

    conexion = pika.BlockingConnection(pika.URLParameters(a.url))
    canal = conexion.channel()
    declarar(canal)
    if a.declare_only:
        conexion.close()
        print(json.dumps({"declared": True}))
        return 0

    vistos: list[str] = []
    rechazados = 0

    def al_recibir(ch, metodo, props, cuerpo):
        nonlocal rechazados
        try:
            lista = cabeceras(props)
            clave = dict(lista).get("entrega-key")
            evento = validar(cuerpo, clave, lista)
            if evento["id_evento"] not in vistos:
                vistos.append(evento["id_evento"])
            ch.basic_ack(delivery_tag=metodo.delivery_tag)
        except EnvolturaInvalida as e:
            print(f"permanente: {e}", file=sys.stderr)
            rechazados += 1
            ch.basic_nack(delivery_tag=metodo.delivery_tag, requeue=False)   # → DLQ

    canal.basic_qos(prefetch_count=10)
    canal.basic_consume(queue="inventario.pedidos", on_message_callback=al_recibir)
    fin = time.monotonic() + a.timeout
    while len(vistos) < a.expect or rechazados < a.poison:
        if time.monotonic() > fin:
            print(json.dumps({"ids": vistos, "rejected": rechazados}))
            return 1
        conexion.process_data_events(time_limit=0.2)
    conexion.close()
    print(json.dumps({"ids": vistos, "rejected": rechazados}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
