"""Multi-turn episodes: environments, tools, the token-in/token-out episode, and the batched driver.

See ``docs/environments.md`` for the interface with a complete example.
"""

from lit_fgrpo.environments.base import (
    BUILTIN_ENVIRONMENTS,
    ROUTE_COLUMN,
    Environment,
    EnvironmentSet,
    EnvironmentSpec,
    TextEnvironment,
    load_environment,
    load_environments,
    load_tools,
    tool_names,
)
from lit_fgrpo.environments.call_formats import (
    CallFormat,
    ToolCallFormat,
    call_format,
    parse_tool_calls,
    tool_instructions,
)
from lit_fgrpo.environments.driver import EpisodeDriver, EpisodeStart, Generate
from lit_fgrpo.environments.episode import (
    Episode,
    EpisodeLimits,
    Segment,
    TrainingRow,
    sample_seed,
    training_row,
    turn_seed,
)
from lit_fgrpo.environments.episode_stats import episode_stats
from lit_fgrpo.environments.faults import EnvironmentFault
from lit_fgrpo.environments.rows import pad_training_rows
from lit_fgrpo.environments.tools import ToolCall, ToolCallError, ToolError
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.environments.workers import Isolation, RemoteEnvironment, WorkerPool

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "CallFormat",
    "ROUTE_COLUMN",
    "ChatTurns",
    "Environment",
    "EnvironmentSet",
    "EnvironmentSpec",
    "EnvironmentFault",
    "Episode",
    "EpisodeDriver",
    "EpisodeLimits",
    "EpisodeStart",
    "Generate",
    "Isolation",
    "RemoteEnvironment",
    "WorkerPool",
    "Segment",
    "TextEnvironment",
    "ToolCall",
    "ToolCallError",
    "ToolCallFormat",
    "ToolError",
    "TrainingRow",
    "call_format",
    "episode_stats",
    "load_environment",
    "load_environments",
    "load_tools",
    "pad_training_rows",
    "parse_tool_calls",
    "sample_seed",
    "tool_instructions",
    "tool_names",
    "training_row",
    "turn_seed",
]
