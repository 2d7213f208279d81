"""Chat and code-editing prompts for scripts/train_speculator.py and the speculation benchmarks,
built from fixed templates (no download). `split(prompts)` keeps one prompt in 5 (a different
template for each topic or snippet) for held-out evaluation and benchmarking, so the benchmark
never measures prompts the heads were trained on."""

from __future__ import annotations

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "compound interest", "vaccines",
    "the French Revolution", "machine learning", "plate tectonics", "the immune system",
    "climate change", "the stock market", "electric cars", "the internet", "volcanoes",
    "recycling", "sleep", "coffee", "the moon landing", "honey bees", "solar panels",
    "inflation", "the Roman Empire", "earthquakes", "rainbows",
]  # fmt: skip
CHAT_TEMPLATES = [
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t} for a school newsletter.",
    "Why is {t} important? Answer briefly.",
    "Give me a simple analogy for {t}.",
]
SNIPPETS = [
    "def add(a, b):\n    return a + b",
    "def is_even(n):\n    if n % 2 == 0:\n        return True\n"
    "    else:\n        return False",
    "def greet(name):\n    print('Hello ' + name)",
    "def total(items):\n    s = 0\n    for x in items:\n        s = s + x\n    return s",
    "def find_max(values):\n    best = values[0]\n    for v in values:\n"
    "        if v > best:\n            best = v\n    return best",
    "def count_words(text):\n    words = text.split(' ')\n    return len(words)",
    "def square_all(nums):\n    out = []\n    for n in nums:\n"
    "        out.append(n * n)\n    return out",
    "def read_file(path):\n    f = open(path)\n    data = f.read()\n    f.close()\n    return data",
]  # fmt: skip
CODE_TEMPLATES = [
    "Add a docstring to this Python function:\n\n{c}",
    "Rename the function to use a clearer name and return the full code:\n\n{c}",
    "Add type hints to this Python function:\n\n{c}",
    "Rewrite this function to be shorter, keeping its behaviour:\n\n{c}",
    "Add a comment to every line of this function:\n\n{c}",
]


def chat_prompts() -> list[str]:
    return [t.format(t=topic) for topic in TOPICS for t in CHAT_TEMPLATES]


def code_prompts() -> list[str]:
    return [t.format(c=code) for code in SNIPPETS for t in CODE_TEMPLATES]


def split(prompts: list[str]) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): one in 5, the template rotating with the subject."""
    held = [(i + i // 5) % 5 == 4 for i in range(len(prompts))]
    return [p for p, h in zip(prompts, held, strict=True) if not h], [
        p for p, h in zip(prompts, held, strict=True) if h
    ]
