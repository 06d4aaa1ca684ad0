#!/usr/bin/env node
// An agent loop that survives `kill -9` of itself or of the daemon: it asks
// a model for a plan, then for each turn asks the model which tool to call
// and calls it. Every model call and tool call is a durable step, so after
// a crash a finished call is replayed from its recorded result instead of
// running again; a checkpoint per turn lets a restarted attempt skip the
// turns already done.
//
//   tether run --restart on-failure \
//       --env NODE_AGENT_EFFECTS=$PWD/effects.log -- node examples/node/agent.js
//
// Settings (environment):
//   NODE_AGENT_TURNS    number of turns (default 5)
//   NODE_AGENT_EFFECTS  file each tool call appends one line to (required):
//                       the side effect a crash must not repeat
//   NODE_AGENT_LLM      a module whose export is `async (prompt) => reply`,
//                       the model (default: the fake model below)
//   NODE_AGENT_PAUSE    seconds to think between turns (default 0.2)
//
// Model calls report their token counts as an event, from inside the step,
// so a replayed call does not count its tokens again.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

/** The package when installed (`npm install ./node`), else the one in this repository. */
function loadTether() {
  try {
    return require('tether-client');
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND') {
      throw e;
    }
    return require(path.join(__dirname, '..', '..', 'node'));
  }
}

const { Worker } = loadTether();

/** A stand-in for a model: the reply follows from the prompt's first words. */
async function fakeLlm(prompt) {
  const [first, second] = prompt.split(' ');
  switch (first) {
    case 'plan':
      return `take a note on each of ${second} turns, then sum up`;
    case 'turn':
      return `note ${second}`;
    default:
      return 'all notes taken';
  }
}

/** The number of words in `text`, as a rough token count. */
const words = (text) => text.split(/\s+/).filter(Boolean).length;

const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

async function main() {
  const turns = Number(process.env.NODE_AGENT_TURNS || 5);
  const effects = process.env.NODE_AGENT_EFFECTS;
  if (!effects) {
    throw new Error('set NODE_AGENT_EFFECTS to the file tool calls append to');
  }
  const pause = Number(process.env.NODE_AGENT_PAUSE || 0.2);
  const model = process.env.NODE_AGENT_LLM ? require(path.resolve(process.env.NODE_AGENT_LLM)) : fakeLlm;

  const w = Worker.fromEnv();

  // One model call, a step named `name`: run once, replayed after a crash.
  const llm = (name, prompt) =>
    w.step(name, async () => {
      const reply = await model(prompt);
      await w.event({ event: 'tokens', prompt: words(prompt), completion: words(reply) });
      return reply;
    });

  // One tool call; its side effect, one line appended, must happen once.
  const tool = (turn, args) =>
    w.step(`tool-${turn}`, () => {
      fs.appendFileSync(effects, `turn ${turn}: ${args}\n`);
      return `done: ${args}`;
    });

  const saved = await w.loadCheckpoint({ schemaVersion: 1 });
  let turn = saved === null ? 0 : saved.json().turn;
  if (saved !== null) {
    console.log(`resumed after turn ${turn}`);
  }

  // After a crash this is the plan recorded the first time.
  const plan = await llm('plan', `plan ${turns}`);
  console.log(`plan: ${plan}`);

  while (turn < turns) {
    turn += 1;
    const call = await llm(`llm-${turn}`, `turn ${turn} of ${turns}: ${plan}`);
    const result = await tool(turn, call);
    console.log(`turn ${turn}: ${result}`);
    await w.saveCheckpoint({ turn }, { schemaVersion: 1, meta: { turn: String(turn) } });
    await sleep(pause);
  }

  const answer = await llm('answer', `sum up ${turns} turns`);
  console.log(`answer: ${answer}`);
}

main().catch((e) => {
  console.error(e instanceof Error ? e.message : e);
  process.exitCode = 1;
});
