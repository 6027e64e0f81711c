// The conversation as the page shows it: one <li> per conversation item (data-item-id,
// data-role), its text streamed in (the answer's, and the user's words as the server
// transcribes them), a badge on answers that did not end by themselves, a meta
// line for the latency, and dividers between calls.

export class Transcript {
  constructor(list) {
    this.list = list;
    // What the user said, as streamed by input audio transcription (item id → text so far, the
    // partial transcripts' newest guess while they speak); a voice item shows it in place of
    // "(voice message)".
    this.userTexts = new Map();
    // Keeps the newest words in view while the answer streams (the list scrolls on wide
    // screens), unless the person has scrolled up to read.
    this.pinned = true;
    this.autoScrollTop = -1;   // where the page last scrolled the list itself
    list.addEventListener("scroll", () => {
      if (Math.abs(list.scrollTop - this.autoScrollTop) < 2) return;   // our own scroll, not the person's
      this.pinned = list.scrollTop + list.clientHeight >= list.scrollHeight - 24;
    });
    new MutationObserver(() => {
      if (!this.pinned) return;
      list.scrollTop = list.scrollHeight;
      this.autoScrollTop = list.scrollTop;
    }).observe(list, { childList: true, subtree: true, characterData: true });
  }

  itemElement(itemId) {
    return itemId ? this.list.querySelector(`li[data-item-id="${CSS.escape(itemId)}"]`) : null;
  }

  ensureItemElement(itemId, role) {
    let element = this.itemElement(itemId);
    if (element) return element;
    this.list.querySelector(".placeholder")?.remove();
    element = document.createElement("li");
    element.className = `turn ${role}`;
    element.dataset.itemId = itemId;
    element.dataset.role = role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Assistant";
    const text = document.createElement("p");
    text.className = "text";
    const meta = document.createElement("p");
    meta.className = "meta";
    element.append(who, text, meta);
    this.list.append(element);
    return element;
  }

  renderItem(item) {
    if (!item || item.type !== "message") return;
    const element = this.ensureItemElement(item.id, item.role);
    element.dataset.added = "true";
    const textElement = element.querySelector(".text");
    const parts = item.content ?? [];
    if (item.role === "user") {
      textElement.textContent = parts.map((part) => {
        if (part.type === "input_text") return part.text;
        if (part.type === "input_audio") return part.transcript ?? this.userTexts.get(item.id) ?? "(voice message)";
        return "";
      }).filter(Boolean).join(" ");
      const images = parts.filter((part) => part.type === "input_image").length;
      element.querySelector(".meta").textContent = images ? `${images} camera frame${images > 1 ? "s" : ""} seen` : "";
      element.classList.toggle(
        "voice",
        parts.some((part) => part.type === "input_audio" && part.transcript == null && !this.userTexts.has(item.id)),
      );
    } else {
      const text = parts.map((part) => part.transcript ?? part.text ?? "").join("");
      // Streaming deltas may already be ahead of a snapshot taken at item.added.
      if (text.length >= textElement.textContent.length) textElement.textContent = text;
    }
  }

  appendUserText(itemId, delta) {
    this.setUserText(itemId, (this.userTexts.get(itemId) ?? "") + (delta ?? ""));
  }

  // `partial`: a guess while the user still speaks (shown dimmed until the transcription after
  // the commit says the words); its item may not exist yet, so this creates its place.
  setUserText(itemId, text, { partial = false } = {}) {
    if (typeof text !== "string") return;
    this.userTexts.set(itemId, text);
    const element = this.ensureItemElement(itemId, "user");
    element.querySelector(".text").textContent = text;
    element.classList.remove("voice");
    element.classList.toggle("partial", partial);
  }

  // The utterance was dropped before its commit (input_audio_buffer.cleared): the words guessed
  // while it was spoken belong to no item.
  dropGuesses() {
    for (const element of this.list.querySelectorAll("li.turn.user.partial:not([data-added])")) {
      this.userTexts.delete(element.dataset.itemId);
      element.remove();
    }
  }

  appendText(itemId, delta) {
    this.ensureItemElement(itemId, "assistant").querySelector(".text").textContent += delta;
  }

  setText(itemId, text) {
    if (typeof text !== "string") return;
    this.ensureItemElement(itemId, "assistant").querySelector(".text").textContent = text;
  }

  // The server dropped the item from the conversation (its history budget, or its turn limit):
  // the model no longer sees it, but the person said or heard it, so it stays on the page, dimmed.
  forget(itemId) {
    const element = this.itemElement(itemId);
    if (!element) return;
    element.classList.add("forgotten");
    element.title = "No longer part of the conversation the model sees";
  }

  // Marks an answer that did not end by itself: "cut off", "length limit", "failed". The latest
  // word wins: an answer that finished generating at the length limit and was then interrupted
  // while playing was cut off.
  mark(itemId, label) {
    const element = this.itemElement(itemId);
    if (!element) return;
    element.classList.add("cut-off");
    let badge = element.querySelector(".badge");
    if (!badge) {
      badge = document.createElement("span");
      badge.className = "badge";
      element.querySelector(".who").after(badge);
    }
    badge.textContent = label;
  }

  /** The line under an item's text (the answer's latency); nothing when the item is not shown. */
  setMeta(itemId, text) {
    const element = this.itemElement(itemId);
    if (element) element.querySelector(".meta").textContent = text;
  }

  addDivider(text) {
    const divider = document.createElement("li");
    divider.className = "divider";
    divider.textContent = text;
    this.list.append(divider);
  }
}
