"""An agent loop that survives `kill -9` of itself or of the daemon.

It asks a model for a plan, then for each turn asks the model what to do and
calls a tool to do it. Every model call and tool call is a durable step
(`@w.step`): after a crash a finished call returns its recorded result
instead of running again. A checkpoint per turn lets a restarted attempt
skip the turns already done.

    tether run --cwd "$PWD" --env AGENT_EFFECTS="$PWD/effects.log" -- python3 examples/python/agent.py

Settings (environment):
    AGENT_TURNS    number of turns (default 5)
    AGENT_EFFECTS  file each tool call appends one line to (required): the
                   side effect a crash must not repeat
    AGENT_PAUSE    seconds to think between turns (default 0.2)
"""

import os
import time

import tether

TURNS = int(os.environ.get("AGENT_TURNS", "5"))
EFFECTS = os.environ["AGENT_EFFECTS"]
PAUSE = float(os.environ.get("AGENT_PAUSE", "0.2"))

w = tether.Worker.from_env()


def llm(prompt: str) -> dict:
    """The model call: the reply and its token counts.

    A stand-in that answers from the prompt's first words. To use a real
    model, replace the body with your client's call and return the same
    shape, for example with the `anthropic` package:

        reply = anthropic.Anthropic().messages.create(
            model="claude-sonnet-4-5", max_tokens=1024,
            messages=[{"role": "user", "content": prompt}])
        return {"text": reply.content[0].text,
                "prompt_tokens": reply.usage.input_tokens,
                "completion_tokens": reply.usage.output_tokens}
    """
    words = prompt.split()
    if words[0] == "plan":
        text = f"take a note on each of {words[1]} turns, then sum up"
    elif words[0] == "turn":
        text = f"note {words[1]}"
    else:
        text = "all notes taken"
    return {"text": text, "prompt_tokens": len(words), "completion_tokens": len(text.split())}


def ask_model(step: str, prompt: str) -> str:
    """Calls the model as durable step `step`. The token counts are reported
    from inside the step, so a replayed call does not count them again."""

    @w.step(step)
    def call() -> str:
        reply = llm(prompt)
        w.event({"step": step, "prompt_tokens": reply["prompt_tokens"],
                 "completion_tokens": reply["completion_tokens"]})
        return reply["text"]

    return call()


def take_note(turn: int, note: str) -> str:
    """The tool: its side effect is one line appended to AGENT_EFFECTS."""
    with open(EFFECTS, "a") as f:
        f.write(f"turn {turn}: {note}\n")
    return f"done: {note}"


# The state after the last finished turn; none yet on a first attempt.
checkpoint = w.load_checkpoint(schema_version=1)
state = checkpoint.json() if checkpoint else {"turn": 0, "results": []}
if checkpoint:
    w.publish(f"resumed after turn {state['turn']}")

# After a crash this returns the plan recorded the first time.
plan = ask_model("plan", f"plan {TURNS} turns")
w.publish(f"plan: {plan}")

while state["turn"] < TURNS:
    turn = state["turn"] + 1
    action = ask_model(f"llm-{turn}", f"turn {turn} of {TURNS}: {plan}")

    @w.step(f"tool-{turn}")
    def tool() -> str:
        return take_note(turn, action)

    result = tool()
    w.publish(f"turn {turn}: {result}")
    state = {"turn": turn, "results": state["results"] + [result]}
    w.save_checkpoint(state, schema_version=1, meta={"turn": str(turn)})
    time.sleep(PAUSE)

answer = ask_model("answer", f"sum up {len(state['results'])} turns")
w.publish(f"answer: {answer}")
