package org.apache.bookkeeper.mledger.deletion;

/**
 * Stand-in for the type of PendingDeleteLedgerInfo.context (Pulsar: the protobuf class
 * MLDataFormats.ManagedLedgerInfo.LedgerInfo, which Avro 1.12.1's reflection cannot build and
 * Avro 1.10.2 reflects into protobuf internals). Only its position and its union with null
 * matter to the bytes: a Java writer can only ever write the context null.
 */
public class LedgerInfo {
    private long ledgerId;
}
