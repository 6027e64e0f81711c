// Function calling on the page: one small example tool the page runs itself (the visitor's
// local time), offered to the model in the session; when a response calls it, the page runs it
// once that response is done, sends the result back (conversation.item.create of a
// function_call_output) and asks for the answer that uses it (response.create). Calls and
// results are shown in the transcript as items of their own.

export const LOCAL_TIME_TOOL = {
  type: "function",
  name: "get_local_time",
  description: "The current local date and time: in the visitor's own timezone, or in the IANA timezone given.",
  parameters: {
    type: "object",
    properties: {
      timezone: { type: "string", description: "An IANA timezone such as Europe/Paris; leave out for the visitor's own." },
    },
    additionalProperties: false,
  },
};

/** The example tool: what the clock says, where the visitor is or in `timezone`. */
export function localTime({ timezone } = {}, now = new Date()) {
  const zone = timezone || Intl.DateTimeFormat().resolvedOptions().timeZone;
  try {
    const local = new Intl.DateTimeFormat("en-GB", { timeZone: zone, dateStyle: "full", timeStyle: "short" });
    return { timezone: zone, local_time: local.format(now) };
  } catch {
    return { error: `unknown timezone: ${zone}` };
  }
}

const TOOLS = { [LOCAL_TIME_TOOL.name]: localTime };

export class PageTools {
  /** `transcript`: where calls and results are shown; `send(event)`: sends on the live call. */
  constructor({ transcript, send }) {
    this.transcript = transcript;
    this.send = send;
  }

  /** What the first session.update carries so that the model may call the page's tool. */
  sessionFields() {
    return { tools: [LOCAL_TIME_TOOL], tool_choice: "auto" };
  }

  handle(event) {
    switch (event.type) {
      case "response.output_item.added":
      case "response.output_item.done":
      case "conversation.item.added":
      case "conversation.item.done":
        this.render(event.item);
        break;
      case "response.function_call_arguments.delta": {
        const element = this.transcript.itemElement(event.item_id);
        if (element) element.querySelector(".text").textContent += event.delta;
        break;
      }
      case "response.done":
        this.run(event.response);
        break;
      default:
        break;
    }
  }

  /** A function_call or function_call_output item, as a transcript entry of its own. */
  render(item) {
    if (item?.type === "function_call") {
      const element = this.entry(item.id, "call", `Tool call: ${item.name}`);
      element.querySelector(".text").textContent = item.arguments;
      element.dataset.status = item.status;
    } else if (item?.type === "function_call_output") {
      this.entry(item.id, "result", "Tool result").querySelector(".text").textContent = item.output;
    }
  }

  entry(itemId, kind, who) {
    let element = this.transcript.itemElement(itemId);
    if (element) return element;
    this.transcript.list.querySelector(".placeholder")?.remove();
    element = document.createElement("li");
    element.className = `turn tool ${kind}`;
    element.dataset.itemId = itemId;
    element.dataset.role = "tool";
    const label = document.createElement("span");
    label.className = "who";
    label.textContent = who;
    const text = document.createElement("p");
    text.className = "text";
    element.append(label, text);
    this.transcript.list.append(element);
    return element;
  }

  /** Runs the calls a finished response made, sends their results, and asks for the answer. */
  run(response) {
    if (response.status !== "completed") return;   // a cut-off call is never made
    const calls = (response.output ?? []).filter((item) => item.type === "function_call" && item.status === "completed");
    if (calls.length === 0) return;
    for (const call of calls) {
      const tool = TOOLS[call.name];
      let result;
      try {
        result = tool ? tool(JSON.parse(call.arguments || "{}")) : { error: `no tool named ${call.name}` };
      } catch (error) {
        result = { error: `the arguments are not JSON: ${error.message}` };
      }
      this.send({
        type: "conversation.item.create",
        item: { type: "function_call_output", call_id: call.call_id, output: JSON.stringify(result) },
      });
    }
    this.send({ type: "response.create" });
  }
}
