"""Publishes one message exactly as given (key, value, headers), creating the topic if
missing: for trying a consumer on envelopes that break the contract.

    python produce_raw.py --topic pedidos.eventos --key P-1 --value '{"id_evento": ...}' \\
        --header tipo=pedido.creado --header id_evento=...
"""

import argparse
import sys

from confluent_kafka import Producer

from seed_relay import asegurar_topico


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--topic", default="pedidos.eventos")
    p.add_argument("--partitions", type=int, default=6, help="if the topic must be created")
    p.add_argument("--key", required=True)
    p.add_argument("--value", required=True)
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds")
    args = p.parse_args()
    cabeceras = [tuple(h.split("=", 1)) for h in args.header]
    if any(len(c) != 2 for c in cabeceras):
        print("--header must be NAME=VALUE", file=sys.stderr)
        return 2
    asegurar_topico(args.bootstrap, args.topic, args.partitions, args.timeout)
    errores: list[str] = []
    productor = Producer({"bootstrap.servers": args.bootstrap, "acks": "all"})
    productor.produce(args.topic, key=args.key, value=args.value.encode(), headers=cabeceras,
                      on_delivery=lambda err, _msg: err is not None and errores.append(str(err)))
    if productor.flush(args.timeout) or errores:
        print(f"[raw] no confirmado: {errores}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
