// agent-fsm ui: follows a running run over Server-Sent Events (AG-UI events) and reloads
// the page when the run stops. No other script runs in the page.
"use strict";
(function () {
  const live = document.getElementById("live");
  if (!live || !window.EventSource) return;
  const list = document.getElementById("live-events");
  const stateCell = document.getElementById("run-state");
  const texts = {};
  const show = (text, kind) => {
    const item = document.createElement("li");
    item.className = kind;
    item.textContent = text;
    list.appendChild(item);
    return item;
  };
  const source = new EventSource(live.dataset.events);
  live.dataset.connected = "yes";
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    live.dataset.last = event.type;
    switch (event.type) {
      case "STATE_SNAPSHOT":
        stateCell.textContent = event.snapshot.fsm.state;
        break;
      case "STATE_DELTA":
        for (const op of event.delta) {
          if (op.path === "/fsm/state") {
            stateCell.textContent = op.value;
            show("→ " + op.value, "state");
          }
        }
        break;
      case "TEXT_MESSAGE_START":
        texts[event.messageId] = show("assistant: ", "text");
        break;
      case "TEXT_MESSAGE_CONTENT":
        if (texts[event.messageId]) texts[event.messageId].textContent += event.delta;
        break;
      case "TOOL_CALL_START":
        show("tool call " + event.toolCallName + " (" + event.toolCallId + ")", "tool");
        break;
      case "TOOL_CALL_RESULT":
        show("result: " + event.content, "result");
        break;
      case "RUN_FINISHED":
      case "RUN_ERROR":
        source.close();
        show(event.type === "RUN_ERROR" ? "stopped: " + event.code : "stopped", "end");
        window.setTimeout(() => window.location.reload(), 300);
        break;
      default:
        break;
    }
  };
})();
