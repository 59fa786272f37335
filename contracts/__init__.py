"""The wire: every message the fleet takes or gives, its subjects and its error codes.

Imports nothing of ours; runtimes in other languages use the JSON Schemas generated from here.
"""

from . import errors, inspect, jobs, manage, notices, policy, read, search, state
from ._base import reply_json
from .errors import *  # noqa: F403
from .events import (
    EVENT_KINDS,
    AssistantMessageEvent,
    AssistantMessagePayload,
    ChildResultEvent,
    ChildResultPayload,
    ChildStatus,
    ContextExportEvent,
    ContextExportPayload,
    ContextResetEvent,
    ContextResetPayload,
    Event,
    EventDecodeError,
    ResourceActivatedEvent,
    ResourceActivatedPayload,
    RunStatusEvent,
    RunStatusPayload,
    OperationReconcileEvent,
    PhaseChangeEvent,
    PhaseChangePayload,
    SourceRef,
    StatePatchEvent,
    SystemEvent,
    SystemPayload,
    ToolCall,
    ToolOutcomeEvent,
    ToolOutcomePayload,
    ToolStatus,
    UserInputEvent,
    UserInputPayload,
    content_sha256,
    decode_event,
    event_json_schema,
)
from .branches import ExportPage, ExportRequest, ForkRequest, SessionForked
from .hooks import HookSet, HooksRegistered
from .ids import EventKey, InstanceId, RunId, SessionId, ThreadId, split_thread_id, thread_id_of
from .inspect import *  # noqa: F403
from .read import *  # noqa: F403
from .notices import *  # noqa: F403
from .search import *  # noqa: F403
from .manage import *  # noqa: F403
from .gateway import (
    GATEWAY_CHECK,
    FinalCheck,
    FinalCheckRequest,
    GatewayAddition,
    gateway_check_subject,
)
from .jobs import *  # noqa: F403
from .state import *  # noqa: F403
from .policy import *  # noqa: F403
from .prepare import (
    Authority,
    BlockKind,
    BudgetCategory,
    BudgetReport,
    ChatFunction,
    ChatMessage,
    ChatTool,
    RequestFormat,
    ChatToolCall,
    ContextBlock,
    EvidenceRef,
    ModelProfile,
    OmittedBlock,
    PendingCall,
    PreparedContext,
    PrepareRequest,
    ProtectedBlock,
    ProviderOverflow,
    Purpose,
    RecordRef,
    ReportedUsage,
    Retention,
    SourceWatermark,
    SummaryHook,
    SummaryRef,
    ToolSchema,
)

__all__ = [
    "ExportPage",
    "ExportRequest",
    "ForkRequest",
    "HookSet",
    "HooksRegistered",
    "SessionForked",
    "content_sha256",
    "reply_json",
    "GATEWAY_CHECK",
    "FinalCheck",
    "FinalCheckRequest",
    "GatewayAddition",
    "gateway_check_subject",
    "Authority",
    "ProtectedBlock",
    "EVENT_KINDS",
    "AssistantMessageEvent",
    "AssistantMessagePayload",
    "BlockKind",
    "BudgetCategory",
    "BudgetReport",
    "ChatFunction",
    "ChatMessage",
    "ChatTool",
    "RequestFormat",
    "ChatToolCall",
    "ChildResultEvent",
    "ChildResultPayload",
    "ChildStatus",
    "ContextBlock",
    "ContextExportEvent",
    "ContextExportPayload",
    "ContextResetEvent",
    "ContextResetPayload",
    "Event",
    "EventDecodeError",
    "EventKey",
    "EvidenceRef",
    "InstanceId",
    "ModelProfile",
    "OmittedBlock",
    "PendingCall",
    "ProviderOverflow",
    "PrepareRequest",
    "PreparedContext",
    "Purpose",
    "RecordRef",
    "ReportedUsage",
    "ResourceActivatedEvent",
    "ResourceActivatedPayload",
    "Retention",
    "RunId",
    "RunStatusEvent",
    "RunStatusPayload",
    "OperationReconcileEvent",
    "PhaseChangeEvent",
    "PhaseChangePayload",
    "SourceRef",
    "StatePatchEvent",
    "SessionId",
    "SourceWatermark",
    "SummaryHook",
    "SummaryRef",
    "SystemEvent",
    "SystemPayload",
    "ThreadId",
    "ToolCall",
    "ToolOutcomeEvent",
    "ToolOutcomePayload",
    "ToolSchema",
    "ToolStatus",
    "UserInputEvent",
    "UserInputPayload",
    "decode_event",
    "event_json_schema",
    "split_thread_id",
    "thread_id_of",
]
# Each of these modules is exported whole.
__all__ += errors.__all__
__all__ += inspect.__all__
__all__ += read.__all__
__all__ += notices.__all__
__all__ += search.__all__
__all__ += manage.__all__
__all__ += jobs.__all__
__all__ += state.__all__
__all__ += policy.__all__
