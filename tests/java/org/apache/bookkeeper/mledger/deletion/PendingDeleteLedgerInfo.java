package org.apache.bookkeeper.mledger.deletion;

import java.util.HashMap;
import java.util.Map;

/**
 * PIP-186's PendingDeleteLedgerInfo (seed 000), fields as declared there; `context` has a
 * stand-in type (see LedgerInfo): Java can only ever write it null.
 */
public class PendingDeleteLedgerInfo {
    private String topicName;
    private LedgerComponent ledgerComponent;
    private LedgerType ledgerType;
    private Long ledgerId;
    private LedgerInfo context;
    private boolean checkLedgerStillInUse;
    private Map<String, String> properties = new HashMap<>();

    public String describe() {
        return "topicName=" + topicName + " ledgerComponent=" + ledgerComponent + " ledgerType=" + ledgerType
                + " ledgerId=" + ledgerId + " context=" + (context == null ? "null" : "set") + " checkLedgerStillInUse=" + checkLedgerStillInUse
                + " properties=" + new java.util.TreeMap<>(properties == null ? Map.of() : properties);
    }

    public void set(String topic, LedgerComponent c, LedgerType t, Long id, boolean check, Map<String, String> p) {
        topicName = topic; ledgerComponent = c; ledgerType = t; ledgerId = id; checkLedgerStillInUse = check;
        properties = p;
    }
}
