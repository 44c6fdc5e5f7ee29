"""The baseline of `km0 bench rpc`: the seed's request/reply client (cliente_pagos_rpc.py, its
fragment unchanged, imported as it is) against the trivial responder a user would write with
pika, on pagos.autorizaciones of localhost's RabbitMQ.

    bench_rpc.py responder           answers until killed
    bench_rpc.py clients --calls N --inflight K
                                     K client processes (the seed's client is blocking: one
                                     call in flight per connection), N calls in all; prints
                                     {"calls", "seconds", "latencias_ms": [...]}
"""

import argparse
import json
import multiprocessing
import sys
import time

import pika

COLA = "pagos.autorizaciones"


def responder() -> int:
    conexion = pika.BlockingConnection(pika.ConnectionParameters("localhost"))
    canal = conexion.channel()
    canal.queue_declare(queue=COLA, durable=True)
    canal.basic_qos(prefetch_count=64)

    def al_recibir(ch, metodo, props, cuerpo):
        peticion = json.loads(cuerpo)
        respuesta = {"pedido_id": peticion.get("pedido_id"), "autorizado": True,
                     "id_autorizacion": "AUT-trivial"}
        ch.basic_publish(exchange="", routing_key=props.reply_to,
                         properties=pika.BasicProperties(correlation_id=props.correlation_id,
                                                         content_type="application/json"),
                         body=json.dumps(respuesta))
        ch.basic_ack(delivery_tag=metodo.delivery_tag)

    canal.basic_consume(queue=COLA, on_message_callback=al_recibir)
    print("listo", flush=True)
    canal.start_consuming()
    return 0


def _cliente(args) -> list[float]:
    indice, llamadas, prefijo = args
    import cliente_pagos_rpc as semilla   # the seed's client: its connection opens on import
    latencias = []
    for i in range(llamadas):
        inicio = time.perf_counter()
        semilla.autorizar_tarjeta(f"{prefijo}-{indice}-{i}", 1000 + i)
        latencias.append((time.perf_counter() - inicio) * 1000.0)
    return latencias


def clients(llamadas: int, en_vuelo: int, prefijo: str) -> int:
    reparto = [llamadas // en_vuelo + (1 if i < llamadas % en_vuelo else 0) for i in range(en_vuelo)]
    trabajos = [(i, n, prefijo) for i, n in enumerate(reparto) if n > 0]
    inicio = time.perf_counter()
    if en_vuelo == 1:
        latencias = _cliente(trabajos[0])
    else:
        with multiprocessing.Pool(len(trabajos)) as pool:
            latencias = [l for parte in pool.map(_cliente, trabajos) for l in parte]
    segundos = time.perf_counter() - inicio
    print(json.dumps({"calls": len(latencias), "seconds": segundos, "latencias_ms": latencias}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("modo", choices=["responder", "clients"])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--inflight", type=int, default=1)
    p.add_argument("--prefijo", default="BENCH")
    a = p.parse_args()
    if a.modo == "responder":
        return responder()
    return clients(a.calls, a.inflight, a.prefijo)


if __name__ == "__main__":
    sys.exit(main())
