"""What a topic holds and how far a consumer group got, as one JSON line: per partition the
end offset and the group's committed offset (-1: none), plus the messages read and how many
distinct id_evento headers they carry (duplicates on the topic show as messages > distinct).

    python topic_stats.py --bootstrap 127.0.0.1:9092 --topic pedidos.eventos --group inventario

The end offsets come from reading every partition to its end (the high watermark of the
fetch responses), not from ListOffsets (tansu 0.x, once the test broker, answered
ListOffsets(latest) short of the real end).
"""

import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

# Answers that say "ask again": the group's coordinator is moving or still loading.
COORDINATOR_BUSY = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT}


def committed(consumer, partitions, timeout):
    """The group's committed offsets of `partitions`, asked again while the coordinator is
    busy, as a Kafka client would, until `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.committed(partitions, timeout=max(deadline - time.monotonic(), 1.0))
        except KafkaException as e:
            error = e.args[0]
            busy = error.retriable() or error.code() in COORDINATOR_BUSY
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--topic", default="pedidos.eventos")
    p.add_argument("--group", default="inventario")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds")
    args = p.parse_args()
    # Assigns partitions by hand and never commits: it does not join or move the group.
    consumidor = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                           "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        metadatos = consumidor.list_topics(args.topic, timeout=args.timeout).topics[args.topic]
        if metadatos.error is not None:
            print(f"[stats] {args.topic}: {metadatos.error}", file=sys.stderr)
            return 1
        particiones = sorted(metadatos.partitions)
        consumidor.assign([TopicPartition(args.topic, p, 0) for p in particiones])
        pendientes, leidos, ids = set(particiones), 0, set()
        fin = time.monotonic() + args.timeout
        while pendientes:
            if time.monotonic() > fin:
                print(f"[stats] sin llegar al final de {sorted(pendientes)}", file=sys.stderr)
                return 1
            msg = consumidor.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pendientes.discard(msg.partition())
                continue
            leidos += 1
            ids.update(v for k, v in (msg.headers() or []) if k == "id_evento")
        confirmados = committed(
            consumidor, [TopicPartition(args.topic, p) for p in particiones], args.timeout)
        salida = {"topic": args.topic, "group": args.group, "partitions": {},
                  "messages": leidos, "distinct_ids": len(ids)}
        for tp in confirmados:
            _, alto = consumidor.get_watermark_offsets(tp, cached=True)
            salida["partitions"][str(tp.partition)] = {
                "end": max(alto, 0), "committed": tp.offset if tp.offset >= 0 else -1}
        print(json.dumps(salida), flush=True)
        return 0
    finally:
        consumidor.close()


if __name__ == "__main__":
    sys.exit(main())
