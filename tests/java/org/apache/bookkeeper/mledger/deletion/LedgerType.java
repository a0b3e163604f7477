package org.apache.bookkeeper.mledger.deletion;
public enum LedgerType { LEDGER, OFFLOAD_LEDGER }
