"""Conversations: the transcript and the Python state of an agent conversation, kept and moved together.

`Conversation` is the record (messages in the application's own format, the checkpoint of each code turn, usage);
a `ConversationStore` keeps it (`MemoryConversationStore`, `FileConversationStore`, `S3ConversationStore`,
`PostgresConversationStore`), and `CodeTool.run_code` accepts one in place of a conversation ID.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.conversation._model import (
        CONVERSATION_VERSION,
        MAX_RUN_RECORDS,
        Conversation,
        RunRecord,
        Usage,
        storage_name,
        tool_call_ids,
        tool_result_ids,
        validate_conversation_key,
    )
    from snapcell.conversation._object import S3ConversationStore
    from snapcell.conversation._postgres import PostgresConversationStore
    from snapcell.conversation._stores import (
        ConversationStore,
        FileConversationStore,
        LogConversationStore,
        MemoryConversationStore,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.conversation._model": (
        "CONVERSATION_VERSION",
        "MAX_RUN_RECORDS",
        "Conversation",
        "RunRecord",
        "Usage",
        "storage_name",
        "tool_call_ids",
        "tool_result_ids",
        "validate_conversation_key",
    ),
    "snapcell.conversation._object": ("S3ConversationStore",),
    "snapcell.conversation._postgres": ("PostgresConversationStore",),
    "snapcell.conversation._stores": (
        "ConversationStore",
        "FileConversationStore",
        "LogConversationStore",
        "MemoryConversationStore",
    ),
}

__all__ = [
    "CONVERSATION_VERSION",
    "Conversation",
    "ConversationStore",
    "FileConversationStore",
    "LogConversationStore",
    "MAX_RUN_RECORDS",
    "MemoryConversationStore",
    "PostgresConversationStore",
    "RunRecord",
    "S3ConversationStore",
    "Usage",
    "storage_name",
    "tool_call_ids",
    "tool_result_ids",
    "validate_conversation_key",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
