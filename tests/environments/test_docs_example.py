"""The complete example of ``docs/environments.md`` runs as printed: loaded, driven, rewarded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lit_fgrpo.environments import ChatTurns, EpisodeDriver, EpisodeLimits, EpisodeStart, load_environment
from tests.environments.tiny_chat import ScriptedModel, chat_tokenizer, prompt_ids

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def test_the_documented_environment_plays_a_game() -> None:
    example = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)[0]
    namespace: dict[str, Any] = {}
    exec(compile(example, str(DOC), "exec"), namespace)
    factory = load_environment(namespace["GuessNumber"])
    assert (factory.has_step, factory.has_reward, factory.tools) == (True, True, ())
    guesses = ["Is it 3?", "Then 8.", "No idea.", "5"]
    driver = EpisodeDriver(factory, ChatTurns(chat_tokenizer()), EpisodeLimits(max_turns=6, max_episode_tokens=512))
    question = "Guess my number from 1 to 10."
    (episode,) = driver.run(
        [EpisodeStart(prompt_ids(question), 1, {"prompt": question, "answer": "5"})],
        ScriptedModel(lambda text, turn: guesses[turn]),
    )
    assert [m["content"] for m in episode.messages if m["role"] == "user"] == [
        "Higher.",
        "Lower.",
        "Reply with a number.",
    ]
    assert (episode.turns, episode.end_reason, episode.reward) == (4, "done", 0.25)
