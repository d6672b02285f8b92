"""Benchmark prompts: copy-heavy (the answer reuses the prompt's text) and free-form."""

ARTICLE = (
    "The city council met on Tuesday evening to discuss the future of the old railway station. "
    "Built in 1894, the station served passengers for almost a century before it closed in 1987. "
    "Since then the building has stood empty, and its roof has begun to collapse. Several groups "
    "have proposed plans for the site. A local arts society wants to turn the main hall into a "
    "gallery and workshop space for young artists. A developer has offered to build apartments "
    "while keeping the historic facade. A third group, made up of residents from the surrounding "
    "streets, argues that the land should become a public park with a small museum about the "
    "history of the railway. After three hours of debate, the council voted to commission an "
    "independent study of all three proposals, which will be presented at the next meeting in "
    "March. The mayor said that whatever the outcome, the station must not be allowed to decay "
    "any further, and announced emergency funding to repair the roof before winter."
)

COPY_HEAVY = {
    "summarise": f"Summarise the following article in a few sentences, reusing its wording.\n\n{ARTICLE}",
    "edit": f"Rewrite the following article, replacing 'council' with 'committee'. Keep everything else.\n\n{ARTICLE}",
}
FREE_FORM = {
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "explain": "Explain to a ten-year-old how airplanes stay in the air.",
}

# Requests for code in the chat template, as people send them to an instruct model (raw
# completions of a code prefix make this target close the code block and explain in prose).
CODE_PROMPTS = {
    "code-parse": "Write a Python function that parses an HTTP header line into a (name, value) pair.",
    "code-class": "Implement an LRU cache class in Python with get and put methods.",
}
PROSE_PROMPTS = {  # chat template applied, as an instruct model is served
    "chat-advice": "What are some good ways to improve my sleep?",
    "chat-explain": "Explain what a blockchain is in simple terms.",
}


def distinct_requests(n: int, *, code: bool = False, seed: int = 0, share: float = 0.05) -> list:
    """`n` different requests, none repeated: a server's suffix store would otherwise find
    every answer of a repeated greedy request in its own history and make speculation
    look far better than on real traffic. Alternately a copy-heavy request (summarise or
    rewrite a recorded ShareGPT answer, given in the prompt) and a free-form one (a
    ShareGPT user turn); with `code`, also requests for stdlib functions. All come from
    the held-out split the drafter builds never train on (build_engines/drafter_data.py):
    `share` 0.05 of ShareGPT, ~330 requests. A benchmark that serves no model drafter may take
    more of it (share 1.0: ~6,700 requests; bench/bench_gpu_policies.py, whose GPU levels
    finish thousands of requests)."""
    import random
    from pathlib import Path

    from build_engines.drafter_data import code_documents, code_requests, held_out, sharegpt_turns

    root = Path(__file__).resolve().parents[1]
    turns = [t for t in sharegpt_turns(root / ".cache" / "downloads") if held_out(t[0], seed, share)]
    rng = random.Random(seed)
    rng.shuffle(turns)
    texts = [a for _, _, a in turns if 200 <= len(a) <= 1200]
    questions = [h for _, h, _ in turns]
    copy = [f"Summarise the following text in a few sentences, reusing its wording.\n\n{t}" if i % 2 else
            f"Rewrite the following text, fixing any mistakes. Keep everything else.\n\n{t}"
            for i, t in enumerate(texts)]
    kinds = [copy, questions]
    if code:
        kinds.append([r for k, r in code_requests(code_documents(), 10 * n, seed) if held_out(k, seed, 0.05)])
    out = [k[i] for i in range(min(map(len, kinds))) for k in kinds][:n]  # round-robin: a steady mix
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct requests in share {share} of ShareGPT, {n} asked for")
    return out
