"""Message classes from a serialized FileDescriptorProto, on protobuf 3.20 through 7.x.

Why not protoc's own `*_pb2.py`: Pulsar's Python worker imports its own protobuf before user
code (3.20.x in Pulsar's function images, 6.x in newer ones), and a wheel in the zip's deps/
cannot replace it. protoc's output checks the runtime against the protoc version
(`runtime_version`, absent before 5.26; a newer gencode refuses an older runtime), so it loads
on one range only. The serialized descriptor is the same on every version; this module adds it
to the default pool and builds the classes with `google.protobuf.internal.builder`, the module
protoc's own output has called since 3.20, with the public message_factory API as a fallback.
"""
from __future__ import annotations

from typing import Any, Dict

from google.protobuf import descriptor_pool, message_factory

try:  # present from protobuf 3.20 on; every protoc gencode since then calls it
    from google.protobuf.internal import builder as _builder
except ImportError:  # pragma: no cover - protobuf < 3.20 is not supported, kept for a clear path
    _builder = None


def _message_class(descriptor: Any) -> type:
    """The class of a message descriptor: GetMessageClass (protobuf >= 4.21.8) or the
    MessageFactory.GetPrototype of earlier releases."""
    get = getattr(message_factory, "GetMessageClass", None)
    if get is not None:
        return get(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def load_file(serialized: bytes, module_name: str) -> Dict[str, Any]:
    """Add one serialized FileDescriptorProto to the default pool and return the module globals
    protoc would define: DESCRIPTOR and a class per top-level message (nested ones are
    attributes of their parent)."""
    file_desc = descriptor_pool.Default().AddSerializedFile(serialized)
    if isinstance(file_desc, (bytes, type(None))):  # older pure-python pools return nothing useful
        file_desc = descriptor_pool.Default().FindFileByName(_file_name(serialized))
    names: Dict[str, Any] = {"DESCRIPTOR": file_desc}
    if _builder is not None:
        _builder.BuildMessageAndEnumDescriptors(file_desc, names)
        _builder.BuildTopDescriptorsAndMessages(file_desc, module_name, names)
        return {k: v for k, v in names.items() if not k.startswith("_")}
    for name, desc in file_desc.message_types_by_name.items():
        names[name] = _message_class(desc)
    return names


def _file_name(serialized: bytes) -> str:
    from google.protobuf import descriptor_pb2  # only on the fallback path

    return descriptor_pb2.FileDescriptorProto.FromString(serialized).name
