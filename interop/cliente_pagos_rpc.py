"""The seed's pedidos/cliente_pagos_rpc.py (section 4: request/reply), unchanged between the
markers below, and a main that uses it against km0's pagos: one authorisation per order, the
first one asked again, and one above pagos' limit.

The last line on stdout is a JSON object: {"respuestas": [...], "repetida": {...},
"excesiva": {...}}. Exit status 1 when a call times out (the seed's TimeoutError).
"""

import argparse
import json as _json
import sys

# --- the seed's fragment, unchanged ---------------------------------------------------------
import json
import uuid

import pika

conexion = pika.BlockingConnection(pika.ConnectionParameters("localhost"))
canal = conexion.channel()
# Cola de respuestas exclusiva de este proceso; el broker la borra al desconectar
cola_respuestas = canal.queue_declare(queue="", exclusive=True).method.queue
respuestas = {}


def al_responder(ch, metodo, props, cuerpo):
    respuestas[props.correlation_id] = json.loads(cuerpo)


canal.basic_consume(queue=cola_respuestas, on_message_callback=al_responder, auto_ack=True)


def autorizar_tarjeta(pedido_id, importe_centimos, timeout_s=5.0):
    corr_id = str(uuid.uuid4())
    canal.basic_publish(
        exchange="", routing_key="pagos.autorizaciones",       # cola de trabajo de pagos
        properties=pika.BasicProperties(reply_to=cola_respuestas, correlation_id=corr_id,
                                        content_type="application/json"),
        body=json.dumps({"pedido_id": pedido_id, "importe_centimos": importe_centimos}))
    # Espera activa con límite: procesa eventos del canal hasta que llegue la respuesta
    import time
    fin = time.monotonic() + timeout_s
    while corr_id not in respuestas:
        if time.monotonic() > fin:
            raise TimeoutError(f"pagos no respondió a {corr_id} en {timeout_s} s")
        conexion.process_data_events(time_limit=0.1)
    return respuestas.pop(corr_id)
# --- end of the seed's fragment -------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pedidos", type=int, default=5)
    p.add_argument("--prefijo", default="RPC")
    a = p.parse_args()
    try:
        dadas = [autorizar_tarjeta(f"{a.prefijo}-{i}", 1000 + i) for i in range(a.pedidos)]
        repetida = autorizar_tarjeta(f"{a.prefijo}-0", 1000)
        excesiva = autorizar_tarjeta(f"{a.prefijo}-grande", 10_000_000)
    except TimeoutError as e:
        print(_json.dumps({"error": str(e)}))
        return 1
    print(_json.dumps({"respuestas": dadas, "repetida": repetida, "excesiva": excesiva}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
