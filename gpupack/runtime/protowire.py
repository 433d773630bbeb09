"""The protobuf wire format, by hand: what the node agent's gRPC APIs need of it.

The exporter talks to the kubelet (pod-resources, `exporter.podresources`) and the
kubelet talks to its CSI driver (`node.csi`), each over a handful of small
messages. Encoding and decoding them here keeps the agent free of the `protobuf`
runtime and of generated code. Decoders skip fields they do not model (a newer peer's
additions) and raise `ProtobufError`, naming the message and the byte, on malformed input.
"""

from collections.abc import Iterator, Mapping
from typing import Final, TypeAlias

VARINT, I64, LEN, SGROUP, EGROUP, I32 = range(6)
# A field's value: a varint or fixed-width number, or a length-delimited payload.
Value: TypeAlias = int | memoryview
_MAX_VARINT_BITS: Final = 64


class ProtobufError(ValueError):
    """Bytes that are not a well-formed protobuf message; the message says where."""


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | LEN) + varint(len(payload)) + payload


def str_field(number: int, text: str) -> bytes:
    """A string field; empty strings are not sent (proto3's default)."""
    return len_field(number, text.encode()) if text else b""


def bool_field(number: int, value: bool) -> bytes:
    """A bool field; false is not sent (proto3's default)."""
    return varint(number << 3 | VARINT) + b"\x01" if value else b""


def map_field(number: int, entries: Mapping[str, str]) -> bytes:
    """A map<string, string>, as Go marshals it: entries sorted by key."""
    return b"".join(
        len_field(number, str_field(1, key) + str_field(2, value))
        for key, value in sorted(entries.items())
    )


def _read_varint(data: memoryview, pos: int, message: str) -> tuple[int, int]:
    start, result = pos, 0
    for shift in range(0, 70, 7):  # at most 10 bytes
        if pos >= len(data):
            raise ProtobufError(f"{message}: truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if result >> _MAX_VARINT_BITS:
                break
            return result, pos
    raise ProtobufError(f"{message}: varint longer than 64 bits at byte {start}")


def fields(data: memoryview | bytes, message: str) -> Iterator[tuple[int, int, Value]]:
    """Each (field number, wire type, value) of one message, in the order sent."""
    data = memoryview(data)
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos, message)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ProtobufError(f"{message}: field number 0 at byte {pos - 1}")
        value: Value
        if wire_type == VARINT:
            value, pos = _read_varint(data, pos, message)
        elif wire_type in (I64, I32):
            size = 8 if wire_type == I64 else 4
            if pos + size > len(data):
                raise ProtobufError(f"{message}: field {number}: truncated fixed{size * 8}")
            value = int.from_bytes(data[pos : pos + size], "little")
            pos += size
        elif wire_type == LEN:
            length, pos = _read_varint(data, pos, message)
            if length > len(data) - pos:
                raise ProtobufError(
                    f"{message}: field {number}: length {length} runs past the end "
                    f"({len(data) - pos} bytes left)"
                )
            value = data[pos : pos + length]
            pos += length
        elif wire_type in (SGROUP, EGROUP):
            raise ProtobufError(f"{message}: field {number}: groups (wire type 3/4) unsupported")
        else:
            raise ProtobufError(f"{message}: field {number}: invalid wire type {wire_type}")
        yield number, wire_type, value


def skip(data: memoryview | bytes, message: str) -> None:
    """Check that a request whose fields we do not read is well formed: fields a newer
    peer sends are ignored, malformed bytes raise ProtobufError."""
    for _ in fields(data, message):
        pass


def payload(wire_type: int, value: Value, field: str) -> memoryview:
    if wire_type != LEN or not isinstance(value, memoryview):
        raise ProtobufError(f"{field}: wire type {wire_type}, expected 2 (length-delimited)")
    return value


def text(wire_type: int, value: Value, field: str) -> str:
    try:
        return str(payload(wire_type, value, field), "utf-8")
    except UnicodeDecodeError as error:
        raise ProtobufError(f"{field}: not valid UTF-8 ({error.reason})") from None


def flag(wire_type: int, value: Value, field: str) -> bool:
    if wire_type != VARINT or not isinstance(value, int):
        raise ProtobufError(f"{field}: wire type {wire_type}, expected 0 (varint)")
    return value != 0


def map_entry(wire_type: int, value: Value, field: str) -> tuple[str, str]:
    """One entry of a map<string, string>."""
    key = entry_value = ""
    for number, kind, item in fields(payload(wire_type, value, field), field):
        if number == 1:
            key = text(kind, item, f"{field}.key")
        elif number == 2:
            entry_value = text(kind, item, f"{field}.value")
    return key, entry_value
