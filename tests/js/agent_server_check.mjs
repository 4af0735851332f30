// Drives a Keel server through the official LangGraph JS client, @langchain/langgraph-sdk, as a
// front end (useStream, agent-chat-ui) would: KEEL_URL is the server's base URL, KEEL_TOKEN a
// token the SDK sends as `x-api-key`. The server serves the graphs of
// tests/support/thread_graphs.py ("chat", "ask") and a "hold" graph whose run waits at a gate
// the caller opens afterwards (tests/interfaces/test_js_sdk.py).
//
// Prints one JSON line: what the client saw, and `problems` (every mismatch found). Exits 1
// when there is any problem, so a change on either side fails loudly.

import { Client } from "@langchain/langgraph-sdk";

const url = process.env.KEEL_URL;
const token = process.env.KEEL_TOKEN;
if (!url || !token) {
  console.error("KEEL_URL and KEEL_TOKEN are required");
  process.exit(2);
}

// No retries: a failed call is a finding, not something to paper over.
const client = new Client({ apiUrl: url, apiKey: token, callerOptions: { maxRetries: 0 } });
const report = { sdk: "@langchain/langgraph-sdk", problems: [] };
const tag = `js-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`;

function check(ok, what, seen) {
  if (!ok) report.problems.push(`${what}; seen: ${JSON.stringify(seen)}`);
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// A message as a node returned it ([role, content], as LangGraph's own `updates` carry it) or
// as the state holds it ({type, content, id}).
const text = (m) => (Array.isArray(m) ? m[1] : m.content);
const texts = (values) => (values?.messages ?? []).map(text);
const say = (content) => ({ messages: [{ role: "user", content }] });

async function assistants() {
  const found = await client.assistants.search({ limit: 100 });
  report.assistants = found.map((a) => a.graph_id).sort();
  for (const graph of ["ask", "chat", "hold"]) {
    check(report.assistants.includes(graph), `no default assistant for ${graph}`, report.assistants);
  }
  const chat = found.find((a) => a.graph_id === "chat");
  report.chat_assistant_id = chat?.assistant_id;
}

async function chat() {
  const thread = await client.threads.create({ metadata: { tag, kind: "chat" } });
  report.chat_thread_id = thread.thread_id;
  check(thread.status === "idle", "a new thread is not idle", thread.status);

  // The graph id is accepted where an assistant id is (agent-chat-ui sends it).
  const waited = await client.runs.wait(thread.thread_id, "chat", { input: say("hi") });
  report.wait_texts = texts(waited);
  report.wait_turns = waited.turns;
  check(same(report.wait_texts, ["hi", "echo: hi"]), "runs.wait values", waited);

  const state = await client.threads.getState(thread.thread_id);
  report.state = { texts: texts(state.values), turns: state.values.turns, next: state.next };
  check(same(state.next, []), "a finished thread has a next step", state.next);
  check(state.checkpoint?.thread_id === thread.thread_id, "state checkpoint", state.checkpoint);

  // The second turn streams, by the default assistant's id this time.
  const events = [];
  for await (const chunk of client.runs.stream(thread.thread_id, report.chat_assistant_id, {
    input: say("again"),
    streamMode: ["values", "updates"],
  })) {
    events.push(chunk);
  }
  report.stream_events = events.map((e) => e.event);
  const values = events.filter((e) => e.event === "values").map((e) => e.data);
  const updates = events.filter((e) => e.event === "updates").map((e) => e.data);
  report.stream_values = values.map(texts);
  report.stream_updates = updates.map((u) => Object.keys(u));
  report.stream_reply = updates.map((u) => texts(u.reply)).flat();
  report.stream_run_id = events[0]?.data?.run_id;
  check(events[0]?.event === "metadata", "a stream does not start with metadata", events[0]);
  check(typeof report.stream_run_id === "string", "metadata has no run_id", events[0]);
  check(
    same(values.at(-1) && texts(values.at(-1)), ["hi", "echo: hi", "again", "echo: again"]),
    "the last values chunk",
    values.at(-1),
  );
  check(same(report.stream_reply, ["echo: again"]), "the reply's update", updates);
  const run = await client.runs.get(thread.thread_id, report.stream_run_id);
  report.stream_run_status = run.status;
  check(run.status === "success", "the streamed run's status", run.status);
}

async function interruptAndResume() {
  const thread = await client.threads.create({ metadata: { tag, kind: "ask" } });
  report.ask_thread_id = thread.thread_id;
  const paused = await client.runs.wait(thread.thread_id, "ask", {
    input: { question: "colour?" },
  });
  report.paused_interrupts = (paused.__interrupt__ ?? []).map((i) => i.value);

  const state = await client.threads.getState(thread.thread_id);
  const waiting = await client.threads.get(thread.thread_id);
  report.paused = {
    next: state.next,
    task_interrupts: state.tasks.flatMap((t) => t.interrupts.map((i) => i.value)),
    thread_status: waiting.status,
  };
  check(same(state.next, ["ask"]), "an interrupted thread's next", state.next);
  check(waiting.status === "interrupted", "an interrupted thread's status", waiting.status);
  check(
    same(report.paused.task_interrupts, [{ question: "colour?" }]),
    "the interrupt's value",
    state.tasks,
  );

  const resumed = await client.runs.wait(thread.thread_id, "ask", {
    command: { resume: "blue" },
  });
  report.resumed = { answer: resumed.answer, log: resumed.log };
  check(resumed.answer === "blue", "the resume value did not reach interrupt()", resumed);
  check(same(resumed.log, ["asked colour?", "done"]), "the resumed run's log", resumed.log);
  const done = await client.threads.get(thread.thread_id);
  report.resumed.thread_status = done.status;
  check(done.status === "idle", "a resumed thread's status", done.status);
}

async function search() {
  const mine = await client.threads.search({ metadata: { tag }, limit: 100 });
  report.search_tag = mine.map((t) => t.thread_id).sort();
  const expected = [report.chat_thread_id, report.ask_thread_id].sort();
  check(same(report.search_tag, expected), "threads.search by metadata", report.search_tag);
  // A run stamps its graph's id into its thread's metadata.
  const asked = await client.threads.search({ metadata: { tag, graph_id: "ask" } });
  report.search_graph_ask = asked.map((t) => t.thread_id);
  check(same(report.search_graph_ask, [report.ask_thread_id]), "search by graph_id", asked);
}

async function reject() {
  const thread = await client.threads.create({ metadata: { tag: `${tag}-busy` } });
  report.busy_thread_id = thread.thread_id;
  const held = await client.runs.create(thread.thread_id, "hold", { input: { log: [] } });
  report.held_run_id = held.run_id;
  try {
    const second = await client.runs.create(thread.thread_id, "hold", {
      input: { log: [] },
      multitaskStrategy: "reject",
    });
    report.reject = { created: second.run_id };
    check(false, "reject on a busy thread created a run", second);
  } catch (err) {
    report.reject = { status: err.status, error: err.constructor.name };
    check(err.status === 409, "reject on a busy thread", `${err.name}: ${err.message}`);
  }
}

try {
  await assistants();
  await chat();
  await interruptAndResume();
  await search();
  await reject();
} catch (err) {
  report.problems.push(`${err.name}: ${err.message}`);
}
console.log(JSON.stringify(report));
process.exit(report.problems.length ? 1 : 0);
