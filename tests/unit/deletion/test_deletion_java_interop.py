"""PendingDeleteLedgerInfo bytes as Java's Schema.AVRO(PendingDeleteLedgerInfo.class) reads and writes them.

The Java vectors below were printed by tests/java/AvroInterop.java (Avro 1.12.1's
ReflectData.AllowNull, as Pulsar's StructSchema uses with alwaysAllowNull); the last test
compiles and runs that program again when a JDK and PySpark's Avro jar are at hand.
The legacy vectors were written by the codec before this layout (commit ade96d7).
"""
from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import List

import fastavro
import pytest

from pulsar_lifecycle.deletion.codec import (
    PARSED_SCHEMA,
    PROP_COMPONENT,
    PROP_LEDGER_ID,
    PROP_LEDGER_INFO,
    SCHEMA_DICT,
    decode,
    encode,
)
from pulsar_lifecycle.deletion.model import (
    InvalidRequestError,
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
)
from support.paths import TESTS

JAVA_DIR = TESTS / "java"

# AvroInterop schema (context's branch is Java's stand-in type: see LedgerInfo.java)
JAVA_SCHEMA = json.loads(
    '{"type":"record","name":"PendingDeleteLedgerInfo","namespace":"org.apache.bookkeeper.mledger.deletion",'
    '"fields":[{"name":"checkLedgerStillInUse","type":"boolean"},{"name":"context","type":["null",{"type":'
    '"record","name":"LedgerInfo","fields":[{"name":"ledgerId","type":"long"}]}],"default":null},{"name":'
    '"ledgerComponent","type":["null",{"type":"enum","name":"LedgerComponent","symbols":["MANAGED_LEDGER",'
    '"MANAGED_CURSOR","SCHEMA_STORAGE"]}],"default":null},{"name":"ledgerId","type":["null","long"],'
    '"default":null},{"name":"ledgerType","type":["null",{"type":"enum","name":"LedgerType","symbols":'
    '["LEDGER","OFFLOAD_LEDGER"]}],"default":null},{"name":"properties","type":["null",{"type":"map",'
    '"values":"string"}],"default":null},{"name":"topicName","type":["null","string"],"default":null}]}')

# (AvroInterop encode argument, Java's bytes)
JAVA_VECTORS = [
    ("public/default/t|MANAGED_LEDGER|LEDGER|7|true|",
     "01000200020e0200020002207075626c69632f64656661756c742f74"),
    ("public/default/t-partition-1|MANAGED_CURSOR|LEDGER|123456789012|false|cursor=sub",
     "0000020202a8e8c8e99707020002020c637572736f7206737562000238"
     "7075626c69632f64656661756c742f742d706172746974696f6e2d31"),
    ("tenant/ns/x|SCHEMA_STORAGE|LEDGER|0|true|", "01000204020002000200021674656e616e742f6e732f78"),
    ("-|-|-|-|false|a=1,b=", "00000000000204026102310262000000"),
]


def _java_datum(arg: str) -> dict:
    topic, comp, ltype, lid, check, props = arg.split("|")
    none = lambda v: None if v == "-" else v  # noqa: E731
    return {"checkLedgerStillInUse": check == "true", "context": None, "ledgerComponent": none(comp),
            "ledgerId": None if lid == "-" else int(lid), "ledgerType": none(ltype),
            "properties": None if props == "-" else dict(kv.split("=", 1) for kv in props.split(",") if kv),
            "topicName": none(topic)}


def _write(datum: dict, schema=PARSED_SCHEMA) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def _read(data: bytes, schema) -> dict:
    buf = io.BytesIO(data)
    rec = fastavro.schemaless_reader(buf, schema, None)
    assert buf.tell() == len(data)
    return rec


def test_schema_is_javas_field_for_field():
    ours = json.loads(json.dumps(SCHEMA_DICT))
    theirs = JAVA_SCHEMA
    assert [f["name"] for f in ours["fields"]] == [f["name"] for f in theirs["fields"]]  # alphabetical
    assert (ours["name"], ours["namespace"]) == (theirs["name"], theirs["namespace"])
    for mine, java in zip(ours["fields"], theirs["fields"]):
        if mine["name"] == "context":  # the one branch no Java writer can fill (see codec.py)
            assert mine["type"][0] == java["type"][0] == "null" and mine["default"] is None
            assert java["default"] is None
            continue
        assert mine == java


@pytest.mark.parametrize("arg, java_hex", [v[:2] for v in JAVA_VECTORS[:4]])
def test_bytes_equal_javas_for_the_same_values(arg: str, java_hex: str):
    datum = _java_datum(arg)
    assert _write(datum).hex() == java_hex
    if datum["topicName"] is not None:  # representable in the model: through encode() too
        info = PendingDeleteLedgerInfo(datum["topicName"], LedgerComponent(datum["ledgerComponent"]),
                                       LedgerType(datum["ledgerType"]), datum["ledgerId"],
                                       check_ledger_still_in_use=datum["checkLedgerStillInUse"],
                                       properties=datum["properties"])
        assert encode(info).hex() == java_hex
        assert decode(bytes.fromhex(java_hex)) == info  # Java's record decodes


def test_java_schema_reads_our_offload_and_bucket_requests():
    """What a Java reader sees: context null, our component not as an enum symbol (it would
    fail on one it does not know) and no ledger id it could delete."""
    java = fastavro.parse_schema(JAVA_SCHEMA)
    oc = OffloadContext.from_uuid("f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f", driver_name="aws-s3",
                                  driver_metadata={"bucket": "b"})
    offload = PendingDeleteLedgerInfo("tenant/ns/x", LedgerComponent.MANAGED_LEDGER, LedgerType.OFFLOAD_LEDGER, 42,
                                      context=LedgerContext(42, entries=10, size=2048, offload_context=oc))
    rec = _read(encode(offload), java)
    assert rec["context"] is None and rec["ledgerType"] == "OFFLOAD_LEDGER" and rec["ledgerId"] == 42
    info_json = json.loads(rec["properties"][PROP_LEDGER_INFO])  # protobuf JSON mapping of LedgerInfo
    assert info_json["offloadContext"]["uidMsb"] == str(oc.uid_msb)
    assert info_json["offloadContext"]["driverMetadata"] == [{"key": "bucket", "value": "b"}]
    assert decode(encode(offload)) == offload

    bucket = PendingDeleteLedgerInfo("public/default/sched", LedgerComponent.DELAYED_INDEX_BUCKET, LedgerType.LEDGER,
                                     5, properties={"bucketKey": "#pulsar.internal.delayed.bucket_1_2"})
    rec = _read(encode(bucket), java)
    assert (rec["ledgerComponent"], rec["ledgerType"], rec["ledgerId"]) == (None, None, None)
    assert rec["properties"][PROP_COMPONENT] == "DELAYED_INDEX_BUCKET" and rec["properties"][PROP_LEDGER_ID] == "5"
    assert decode(encode(bucket)) == bucket


def test_reserved_properties_are_refused_and_conflicts_rejected():
    with pytest.raises(InvalidRequestError, match="reserved"):
        encode(PendingDeleteLedgerInfo("a/b/c", LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, 1,
                                       properties={PROP_COMPONENT: "x"}))
    both = {**_java_datum("a/b/c|MANAGED_LEDGER|LEDGER|1|true|"), "properties": {PROP_COMPONENT: "DELAYED_INDEX_BUCKET"}}
    with pytest.raises(InvalidRequestError, match="next to"):
        decode(_write(both))
    bad = {**_java_datum("a/b/c|MANAGED_LEDGER|OFFLOAD_LEDGER|1|true|"), "properties": {PROP_LEDGER_INFO: "{"}}
    with pytest.raises(InvalidRequestError, match=PROP_LEDGER_INFO):
        decode(_write(bad))


_OC = OffloadContext.from_uuid("f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f", driver_name="aws-s3",
                               driver_metadata={"bucket": "b", "region": "r"})
# Written by the previous codec (topicName first, DELAYED_INDEX_BUCKET symbol, context as a record).
LEGACY_VECTORS = [
    ("02207075626c69632f64656661756c742f7402000200020e000100",
     PendingDeleteLedgerInfo("public/default/t", LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, 7)),
    ("02387075626c69632f64656661756c742f742d706172746974696f6e2d310202020002a8e8c8e99707000002020c637572736f72"
     "0673756200",
     PendingDeleteLedgerInfo("public/default/t-partition-1", LedgerComponent.MANAGED_CURSOR, LedgerType.LEDGER,
                             123456789012, check_ledger_still_in_use=False, properties={"cursor": "sub"})),
    ("021674656e616e742f6e732f78020002020254025414802080a0abfef96202f1a5d3b589cf969e1e9ef8e8c2e792ade9f0010100"
     "00020c6177732d7333040c6275636b657402620c726567696f6e0272000100",
     PendingDeleteLedgerInfo("tenant/ns/x", LedgerComponent.MANAGED_LEDGER, LedgerType.OFFLOAD_LEDGER, 42,
                             context=LedgerContext(42, entries=10, size=2048, timestamp=1700000000000,
                                                   offload_context=_OC))),
    ("02287075626c69632f64656661756c742f736368656402060200020a00010202126275636b65744b6579462370756c7361722e69"
     "6e7465726e616c2e64656c617965642e6275636b65745f315f3200",
     PendingDeleteLedgerInfo("public/default/sched", LedgerComponent.DELAYED_INDEX_BUCKET, LedgerType.LEDGER, 5,
                             properties={"bucketKey": "#pulsar.internal.delayed.bucket_1_2"})),
]


@pytest.mark.parametrize("legacy_hex, expected", LEGACY_VECTORS)
def test_records_queued_in_the_old_layout_still_decode(legacy_hex: str, expected: PendingDeleteLedgerInfo):
    assert decode(bytes.fromhex(legacy_hex)) == expected
    assert decode(encode(expected)) == expected  # and re-encode in the Java layout


def _avro_classpath() -> List[Path]:
    pyspark = pytest.importorskip("pyspark")
    jars = Path(pyspark.__file__).parent / "jars"
    wanted = ["avro-1.*.jar", "jackson-core-*.jar", "jackson-databind-*.jar", "jackson-annotations-*.jar",
              "slf4j-api-*.jar", "commons-compress-*.jar"]
    found = [sorted(jars.glob(w)) for w in wanted]
    if not all(found):
        pytest.skip(f"PySpark's jars lack one of {wanted}")
    return [f[0] for f in found]


@pytest.mark.timeout(120)
def test_live_java_avro_agrees(tmp_path: Path):
    """Recompile tests/java/AvroInterop.java against PySpark's Avro jar and check everything above."""
    if not shutil.which("javac") or not shutil.which("java"):
        pytest.skip("no JDK (javac) on this machine")
    cp = ":".join(str(j) for j in _avro_classpath())
    sources = [str(p) for p in JAVA_DIR.rglob("*.java")]
    subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(tmp_path), *sources], check=True, timeout=90,
                   capture_output=True)
    ours_bucket = encode(PendingDeleteLedgerInfo("public/default/sched", LedgerComponent.DELAYED_INDEX_BUCKET,
                                                 LedgerType.LEDGER, 5)).hex()
    args = ["schema"]
    for arg, _ in [v[:2] for v in JAVA_VECTORS[:4]]:
        args += ["encode", arg]
    args += ["decode", ours_bucket, "decode", LEGACY_VECTORS[3][0]]
    out = subprocess.run(["java", "-cp", f"{tmp_path}:{cp}", "AvroInterop", *args], check=True, timeout=60,
                         capture_output=True, text=True).stdout.strip().splitlines()
    assert json.loads(out[0]) == JAVA_SCHEMA
    assert out[1:5] == [v[1] for v in JAVA_VECTORS[:4]]
    assert out[5].startswith("topicName=public/default/sched ledgerComponent=null ledgerType=null ledgerId=null")
    assert "__pl_ledger_component__=DELAYED_INDEX_BUCKET" in out[5]
    assert out[6].startswith("FAILED")  # why the old layout had to go: Java cannot read it
