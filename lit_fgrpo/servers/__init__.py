"""Generation on its own servers: the ``vllm_server`` rollout engine over stock ``vllm serve`` processes.

Nothing here imports vLLM: the servers are other processes, reached over HTTP. See ``docs/engines.md``,
section "Generation on its own servers". The trainer-side launcher is ``launcher.py``; ``server_main.py`` is the
entry each launched server process runs.
"""

from lit_fgrpo.servers.errors import ServerError
from lit_fgrpo.servers.server_settings import ServerSettings

__all__ = ["ServerError", "ServerSettings"]
