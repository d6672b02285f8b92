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
