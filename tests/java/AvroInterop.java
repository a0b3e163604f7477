import java.io.ByteArrayOutputStream;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.reflect.ReflectData;
import org.apache.avro.reflect.ReflectDatumReader;
import org.apache.avro.reflect.ReflectDatumWriter;
import org.apache.bookkeeper.mledger.deletion.LedgerComponent;
import org.apache.bookkeeper.mledger.deletion.LedgerType;
import org.apache.bookkeeper.mledger.deletion.PendingDeleteLedgerInfo;

/**
 * What Pulsar's Schema.AVRO(PendingDeleteLedgerInfo.class) does (ReflectData.AllowNull, as
 * Pulsar's StructSchema with alwaysAllowNull), used by tests/test_deletion_java_interop.py:
 *   schema                      prints the schema JSON
 *   encode topic|comp|type|id|check|k=v,k=v   prints the hex of Java's bytes ("-" = null)
 *   decode HEX                  reads bytes with the schema and prints the fields
 * Built against the Avro jar PySpark ships (pyspark/jars/avro-*.jar).
 */
public class AvroInterop {
    public static void main(String[] args) throws Exception {
        Schema schema = ReflectData.AllowNull.get().getSchema(PendingDeleteLedgerInfo.class);
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "schema" -> System.out.println(schema);
                case "encode" -> System.out.println(encode(schema, args[++i].split("\\|", -1)));
                case "decode" -> {
                    byte[] data = HexFormat.of().parseHex(args[++i]);
                    try {
                        PendingDeleteLedgerInfo p = new ReflectDatumReader<PendingDeleteLedgerInfo>(
                                schema, schema, ReflectData.AllowNull.get())
                                .read(null, DecoderFactory.get().binaryDecoder(data, null));
                        System.out.println(p.describe());
                    } catch (Exception e) {
                        System.out.println("FAILED " + e.getClass().getSimpleName() + ": " + e.getMessage());
                    }
                }
                default -> throw new IllegalArgumentException(args[i]);
            }
        }
    }

    private static String encode(Schema schema, String[] f) throws Exception {
        Map<String, String> props = null;
        if (!f[5].equals("-")) {
            props = new LinkedHashMap<>();
            for (String kv : f[5].split(",")) {
                if (!kv.isEmpty()) {
                    String[] x = kv.split("=", 2);
                    props.put(x[0], x[1]);
                }
            }
        }
        PendingDeleteLedgerInfo p = new PendingDeleteLedgerInfo();
        p.set(f[0].equals("-") ? null : f[0], f[1].equals("-") ? null : LedgerComponent.valueOf(f[1]),
                f[2].equals("-") ? null : LedgerType.valueOf(f[2]), f[3].equals("-") ? null : Long.valueOf(f[3]),
                Boolean.parseBoolean(f[4]), props);
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        BinaryEncoder enc = EncoderFactory.get().binaryEncoder(out, null);
        new ReflectDatumWriter<PendingDeleteLedgerInfo>(schema, ReflectData.AllowNull.get()).write(p, enc);
        enc.flush();
        return HexFormat.of().formatHex(out.toByteArray());
    }
}
