// The Java client's batched producer as the de-duplication benchmark's child
// (bench/vs_pulsar/dedup.py, contender "broker dedup, Java client"): the same work as the Python
// dedup child's broker kind, through org.apache.pulsar:pulsar-client-original.
//
// Ids start..n (100-byte payloads as bench/_writer_common.payload_of: the id in 10 digits, then dots),
// a producer name and explicit sequence ids, batching on (10 ms, LZ4), bursts of 1000 with one
// callback per burst (on the burst's last send), the highest confirmed id checkpointed every 5000
// (written to a temporary file and moved over the checkpoint, as a source commits its offsets).
// Resume: the checkpoint + 1, with "last-sequence-id" also past Producer.getLastSequenceId() (what
// the broker says it has: Pulsar's pattern). The Java batch container sends a batch with its
// lowest id as sequence_id and its highest as highest_sequence_id, and the broker de-duplicates a
// batch on the highest: that is the behaviour measured here beside pulsar-client's (C++) batches.
//
// Usage: java -cp <classes>:<pulsar-client jars> BatchedDedupProducer SERVICE_URL TOPIC CHECKPOINT N
//        PAYLOAD_BYTES checkpoint|last-sequence-id batched|unbatched PRODUCER_NAME
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;

public final class BatchedDedupProducer {
    private static final int BURST = 1000;
    private static final int CHECKPOINT_EVERY = 5000;

    private BatchedDedupProducer() {
    }

    static byte[] payload(long id, int size) {
        String head = String.format("%010d", id);
        byte[] out = new byte[Math.max(size, head.length())];
        java.util.Arrays.fill(out, (byte) '.');
        byte[] h = head.getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(h, 0, out, 0, h.length);
        return out;
    }

    static long readCheckpoint(Path ckpt) {
        try {
            return Long.parseLong(Files.readString(ckpt).trim());
        } catch (java.io.IOException | NumberFormatException e) {
            return 0L;
        }
    }

    static void writeCheckpoint(Path ckpt, long value) throws java.io.IOException {
        Path tmp = ckpt.resolveSibling(ckpt.getFileName() + ".tmp");
        Files.writeString(tmp, Long.toString(value));
        Files.move(tmp, ckpt, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 8) {
            System.err.println("usage: BatchedDedupProducer SERVICE_URL TOPIC CHECKPOINT N PAYLOAD_BYTES "
                    + "checkpoint|last-sequence-id batched|unbatched PRODUCER_NAME");
            System.exit(2);
        }
        String url = args[0];
        String topic = args[1];
        Path ckpt = Paths.get(args[2]);
        long n = Long.parseLong(args[3]);
        int payloadBytes = Integer.parseInt(args[4]);
        boolean pastLast = args[5].equals("last-sequence-id");
        boolean batched = args[6].equals("batched");
        String name = args[7];
        long t0 = System.nanoTime();
        long start = readCheckpoint(ckpt) + 1;
        PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
        Producer<byte[]> producer = null;
        // The killed predecessor's connection may hold the producer name for a moment.
        for (int attempt = 0; attempt < 60 && producer == null; attempt++) {
            try {
                producer = client.newProducer().topic(topic).producerName(name)
                        .enableBatching(batched).batchingMaxPublishDelay(10, TimeUnit.MILLISECONDS)
                        .sendTimeout(0, TimeUnit.SECONDS).compressionType(CompressionType.LZ4)
                        .blockIfQueueFull(true).maxPendingMessages(1000).create();
            } catch (PulsarClientException.ProducerBusyException e) {
                Thread.sleep(500);
            }
        }
        if (producer == null) {
            System.err.println("broker dedup (Java): producer name still busy after 30 s");
            System.exit(3);
        }
        long highest = producer.getLastSequenceId();
        if (pastLast) {
            start = Math.max(start, highest + 1);
        }
        AtomicLong confirmed = new AtomicLong(start - 1);
        long written = start - 1;
        java.util.concurrent.CompletableFuture<Void> lastBurst = java.util.concurrent.CompletableFuture.completedFuture(null);
        for (long s = start; s <= n; s += BURST) {
            long last = Math.min(n, s + BURST - 1);
            for (long i = s; i <= last; i++) {
                var future = producer.newMessage().value(payload(i, payloadBytes)).sequenceId(i).sendAsync();
                if (i == last) {
                    final long upTo = last;
                    lastBurst = future.thenAccept(id -> confirmed.accumulateAndGet(upTo, Math::max));
                }
            }
            long c = confirmed.get();
            if (c - written >= CHECKPOINT_EVERY) {
                writeCheckpoint(ckpt, c);
                written = c;
            }
        }
        producer.flush();
        lastBurst.join();  // its callback has run: the checkpoint holds the last id
        writeCheckpoint(ckpt, confirmed.get());
        producer.close();
        client.close();
        double seconds = (System.nanoTime() - t0) / 1e9;
        System.out.printf("dedup-child java: resumed from %d, sent up to %d in %.1f s; broker last_sequence_id=%d; "
                + "finished_ms=%d%n", start, n, seconds, highest, System.currentTimeMillis());
        System.out.flush();
    }
}
