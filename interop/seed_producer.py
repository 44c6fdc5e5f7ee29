"""pedidos' crear_pedido, written the way the seed writes it: the order, its lines and its
pedido.creado row in the outbox, in one transaction, with no Kafka in sight.

As a script it creates --orders N orders with deterministic ids and lines (those that do
not exist yet) and prints a JSON line with how many it created.
"""

import argparse
import json
import sys
import uuid
from typing import Any

import psycopg

# The seed's tables (pedidos, lineas_pedido) and its outbox with the exact columns.
ESQUEMA = """
CREATE TABLE IF NOT EXISTS pedidos (
    id        TEXT        PRIMARY KEY,
    cliente   TEXT        NOT NULL,
    mercado   TEXT        NOT NULL,
    estado    TEXT        NOT NULL,
    creado_en TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lineas_pedido (
    pedido_id       TEXT    NOT NULL REFERENCES pedidos (id),
    producto        TEXT    NOT NULL,
    cantidad        INTEGER NOT NULL CHECK (cantidad > 0),
    precio_centimos INTEGER NOT NULL CHECK (precio_centimos >= 0)
);
CREATE TABLE IF NOT EXISTS outbox (
    id           UUID        PRIMARY KEY,
    agregado     TEXT        NOT NULL,
    agregado_id  TEXT        NOT NULL,
    tipo         TEXT        NOT NULL,
    version      INTEGER     NOT NULL DEFAULT 1,
    carga        JSONB       NOT NULL,
    creado_en    TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicado_en TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS outbox_pendientes ON outbox (creado_en) WHERE publicado_en IS NULL;
"""

# Products with plenty of units in the seed's initial stock (about 60 orders' worth).
PRODUCTOS = ("tomate-rosa", "calabacin")


def crear_tablas(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute(ESQUEMA)


def pedido_numero(i: int, prefijo: str = "P-2026-") -> dict[str, Any]:
    """Order number i (from 1): always the same id and lines for the same i."""
    lineas = [{"producto": PRODUCTOS[i % 2], "cantidad": 1 + i % 3, "precio_centimos": 250}]
    if i % 4 == 0:
        lineas.append({"producto": "vino-crianza", "cantidad": 2, "precio_centimos": 900})
    return {"id": f"{prefijo}{i:06d}", "cliente": f"cliente-{i % 7}", "mercado": "girona",
            "lineas": lineas}


def crear_pedido(conn: psycopg.Connection, pedido: dict[str, Any]) -> uuid.UUID:
    """Stores the order AND its event in a single transaction; returns the id_evento."""
    id_evento = uuid.uuid4()
    with conn.transaction():
        with conn.cursor() as cur:
            cur.execute("INSERT INTO pedidos (id, cliente, mercado, estado) "
                        "VALUES (%s, %s, %s, 'creado')",
                        (pedido["id"], pedido["cliente"], pedido["mercado"]))
            for linea in pedido["lineas"]:
                cur.execute("INSERT INTO lineas_pedido (pedido_id, producto, cantidad, "
                            "precio_centimos) VALUES (%s, %s, %s, %s)",
                            (pedido["id"], linea["producto"], linea["cantidad"],
                             linea["precio_centimos"]))
            cur.execute("INSERT INTO outbox (id, agregado, agregado_id, tipo, carga) "
                        "VALUES (%s, 'pedido', %s, 'pedido.creado', %s)",
                        (id_evento, pedido["id"], json.dumps(pedido)))
    return id_evento


def crear_pedidos(conn: psycopg.Connection, n: int, prefijo: str) -> int:
    """Creates orders 1..n that are not there yet; returns how many it created."""
    creados = 0
    for i in range(1, n + 1):
        pedido = pedido_numero(i, prefijo)
        existe = conn.execute("SELECT 1 FROM pedidos WHERE id = %s", (pedido["id"],)).fetchone()
        conn.commit()  # end the read's implicit transaction before crear_pedido's own
        if existe is None:
            crear_pedido(conn, pedido)
            creados += 1
    return creados


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--orders", type=int, required=True)
    p.add_argument("--id-prefix", default="P-2026-")
    args = p.parse_args()
    with psycopg.connect(args.dsn) as conn:
        crear_tablas(conn)
        creados = crear_pedidos(conn, args.orders, args.id_prefix)
    print(json.dumps({"created": creados}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
