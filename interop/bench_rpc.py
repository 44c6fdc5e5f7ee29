"""The baseline of `km0 bench rpc`: the seed's request/reply client (cliente_pagos_rpc.py, its
fragment unchanged, imported as it is) against the trivial responder a user would write with
pika, on pagos.autorizaciones of localhost's RabbitMQ.

    bench_rpc.py responder           answers until killed
    bench_rpc.py clients --calls N --inflight K
                                     K client processes (the seed's client is blocking: one
                                     call in flight per connection), N calls in all; prints
                                     {"calls", "seconds", "latencias_ms": [...]}

The clients are timed in their steady state, as entrega's side is: every process imports the
seed's client (which connects on import) and waits for the others at a barrier; the seconds run
from the first call to the last reply.
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


_barrera = None


def _iniciar(barrera) -> None:
    global _barrera
    _barrera = barrera


def _cliente(args) -> tuple[float, float, list[float]]:
    indice, llamadas, prefijo = args
    import cliente_pagos_rpc as semilla   # the seed's client: its connection opens on import
    if _barrera is not None:
        _barrera.wait()
    latencias = []
    empieza = time.perf_counter()
    for i in range(llamadas):
        inicio = time.perf_counter()
        semilla.autorizar_tarjeta(f"{prefijo}-{indice}-{i}", 1000 + i)
        latencias.append((time.perf_counter() - inicio) * 1000.0)
    return empieza, time.perf_counter(), latencias


def clients(llamadas: int, en_vuelo: int, prefijo: str) -> int:
    reparto = [llamadas // en_vuelo + (1 if i < llamadas % en_vuelo else 0) for i in range(en_vuelo)]
    trabajos = [(i, n, prefijo) for i, n in enumerate(reparto) if n > 0]
    if len(trabajos) == 1:
        partes = [_cliente(trabajos[0])]
    else:
        # One process per client, each blocked at the barrier in its only task until all are
        # connected.
        barrera = multiprocessing.Barrier(len(trabajos))
        with multiprocessing.Pool(len(trabajos), initializer=_iniciar,
                                  initargs=(barrera,)) as pool:
            partes = pool.map(_cliente, trabajos, chunksize=1)
    segundos = max(fin for _, fin, _ in partes) - min(empieza for empieza, _, _ in partes)
    latencias = [l for _, _, parte in partes for l in parte]
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
