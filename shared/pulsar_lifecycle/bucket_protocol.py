"""Property names of the scheduling protocol shared by every producer and the scheduler."""

DELIVER_AT_PROP = "__pl_deliver_at__"  # deliver-at, integer ms since epoch, decimal string
TARGET_PROP = "__pl_target__"  # optional fully qualified target topic of the release
CANCEL_PROP = "__pl_cancel__"  # "<ledgerId>:<entryId>[:<batchIndex>]" of a scheduling message to cancel
ORIGIN_MSG_ID_PROP = "__pl_origin_msg_id__"  # "<ledgerId>:<entryId>:<partition>" on releases (":<batchIndex>" appended for a batched message)
