"""Generation on its own servers: the ``vllm_server`` rollout engine over stock ``vllm serve`` processes.

Nothing here imports vLLM: the servers are other processes, reached over HTTP. See ``README.md``, section
"Generation on its own servers".
"""

from lit_fgrpo.servers.errors import ServerError
from lit_fgrpo.servers.server_settings import ServerSettings

__all__ = ["ServerError", "ServerSettings"]
