"""The event envelope of pedidos.eventos as a seed-style service reads it.

Wire contract (DESIGN.md section 2): a JSON object
    {"id_evento": "<uuid>", "tipo": "pedido.creado", "version": 1,
     "fecha_ms": <epoch ms>, "origen": "pedidos", "datos": {...}}
with Kafka headers `tipo` and `id_evento` equal to the envelope's, and key = agregado_id
(for pedido.creado, the order id). Unknown fields are ignored.
"""

import json
import uuid
from typing import Any

# Field -> the Python type json.loads must produce for it.
CAMPOS: dict[str, type] = {
    "id_evento": str,
    "tipo": str,
    "version": int,
    "fecha_ms": int,
    "origen": str,
    "datos": dict,
}


class EnvolturaInvalida(Exception):
    """The message is not a valid envelope; retrying cannot fix it."""


def _cabeceras(crudas: list[tuple[str, bytes | None]] | None) -> dict[str, str]:
    cabeceras: dict[str, str] = {}
    for nombre, valor in crudas or []:
        if valor is None:
            raise EnvolturaInvalida(f"cabecera {nombre} sin valor")
        try:
            cabeceras[nombre] = valor.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EnvolturaInvalida(f"cabecera {nombre} no es UTF-8: {e}") from e
    return cabeceras


def _campos(evento: dict[str, Any]) -> None:
    for campo, tipo in CAMPOS.items():
        if campo not in evento or evento[campo] is None:
            raise EnvolturaInvalida(f"falta el campo {campo}")
        valor = evento[campo]
        # bool is an int in Python; true/false is no version or timestamp.
        if not isinstance(valor, tipo) or (tipo is int and isinstance(valor, bool)):
            raise EnvolturaInvalida(
                f"campo {campo}: se esperaba {tipo.__name__}, llegó {type(valor).__name__}")
    try:
        canonico = str(uuid.UUID(evento["id_evento"]))
    except ValueError as e:
        raise EnvolturaInvalida(f"id_evento no es un uuid: {e}") from e
    # The text is the idempotency key in mensajes_procesados: another spelling of the same
    # uuid would not be recognised as a duplicate by a consumer that stores it verbatim.
    if canonico != evento["id_evento"]:
        raise EnvolturaInvalida(f"id_evento no está en forma canónica: {evento['id_evento']}")
    for campo in ("tipo", "origen"):
        if not evento[campo].strip():
            raise EnvolturaInvalida(f"campo {campo} vacío")
    if evento["version"] < 1:
        raise EnvolturaInvalida(f"version debe ser >= 1, es {evento['version']}")
    if evento["fecha_ms"] < 0:
        raise EnvolturaInvalida(f"fecha_ms negativa: {evento['fecha_ms']}")


def _pedido_creado(evento: dict[str, Any], clave: str | None) -> None:
    datos = evento["datos"]
    if not isinstance(datos.get("id"), str) or not datos["id"]:
        raise EnvolturaInvalida("datos.id falta o no es un texto")
    if clave != datos["id"]:
        raise EnvolturaInvalida(f"la clave {clave!r} no es el id del pedido {datos['id']!r}")
    lineas = datos.get("lineas")
    if not isinstance(lineas, list):
        raise EnvolturaInvalida("datos.lineas falta o no es una lista")
    for i, linea in enumerate(lineas):
        if not isinstance(linea, dict) or not isinstance(linea.get("producto"), str):
            raise EnvolturaInvalida(f"datos.lineas[{i}].producto falta o no es un texto")
        cantidad = linea.get("cantidad")
        if not isinstance(cantidad, int) or isinstance(cantidad, bool) or cantidad < 1:
            raise EnvolturaInvalida(f"datos.lineas[{i}].cantidad debe ser un entero >= 1")


def validar(valor: bytes | None, clave: bytes | None,
            cabeceras: list[tuple[str, bytes | None]] | None) -> dict[str, Any]:
    """Parses and checks one Kafka message; returns the envelope or raises EnvolturaInvalida."""
    if valor is None:
        raise EnvolturaInvalida("mensaje sin valor")
    try:
        evento = json.loads(valor)
    except (UnicodeDecodeError, ValueError) as e:
        raise EnvolturaInvalida(f"json mal formado: {e}") from e
    if not isinstance(evento, dict):
        raise EnvolturaInvalida("la envoltura no es un objeto json")
    _campos(evento)
    leidas = _cabeceras(cabeceras)
    for nombre in ("tipo", "id_evento"):
        if nombre not in leidas:
            raise EnvolturaInvalida(f"falta la cabecera {nombre}")
        if leidas[nombre] != evento[nombre]:
            raise EnvolturaInvalida(
                f"cabecera {nombre}={leidas[nombre]!r} distinta de la envoltura {evento[nombre]!r}")
    if evento["tipo"] == "pedido.creado":
        try:
            texto_clave = clave.decode("utf-8") if clave is not None else None
        except UnicodeDecodeError as e:
            raise EnvolturaInvalida(f"clave no es UTF-8: {e}") from e
        _pedido_creado(evento, texto_clave)
    return evento
