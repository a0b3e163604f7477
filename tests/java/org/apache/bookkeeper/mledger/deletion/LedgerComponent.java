package org.apache.bookkeeper.mledger.deletion;
public enum LedgerComponent { MANAGED_LEDGER, MANAGED_CURSOR, SCHEMA_STORAGE }
