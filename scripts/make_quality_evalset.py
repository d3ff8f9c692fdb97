"""Writes workloads/quality/eval-v1.jsonl, the eval set of tuner/quality.py: 280 short chat
prompts (one user message each) written for this project: templated arithmetic, capitals and
everyday facts, short instructions; licence-clean. Deterministic (seeded); re-run only to change
the set, and then name it eval-v2 (recorded comparisons cite v1)."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "workloads" / "quality" / "eval-v1.jsonl"

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "China": "Beijing",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "Greece": "Athens",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Hungary": "Budapest",
    "Ireland": "Dublin",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "India": "New Delhi",
    "Thailand": "Bangkok",
    "South Korea": "Seoul",
    "Turkey": "Ankara",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Cuba": "Havana",
    "Colombia": "Bogota",
    "Venezuela": "Caracas",
    "Czech Republic": "Prague",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Ukraine": "Kyiv",
}
FACTS = [
    ("How many days are in a week?", "7"),
    ("How many legs does a spider have?", "8"),
    ("How many continents are there?", "7"),
    ("What color is the sky on a clear day?", "blue"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("What planet do we live on?", "Earth"),
    ("What is frozen water called?", "ice"),
    ("How many hours are in a day?", "24"),
    ("How many minutes are in an hour?", "60"),
    ("What gas do plants absorb from the air?", "carbon dioxide"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What is the chemical symbol for water?", "H2O"),
    ("Which animal is known as the king of the jungle?", "lion"),
    ("How many sides does a triangle have?", "3"),
    ("How many sides does a hexagon have?", "6"),
    ("What is the opposite of hot?", "cold"),
    ("What is the first month of the year?", "January"),
    ("What is the last month of the year?", "December"),
    ("What is the boiling point of water in degrees Celsius?", "100"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
]
TOPICS = [
    "the ocean",
    "autumn",
    "a cat",
    "coffee",
    "mountains",
    "the moon",
    "a library",
    "rain",
    "bicycles",
    "a garden",
    "music",
    "the city at night",
    "friendship",
    "bread",
    "a river",
    "winter",
    "trains",
    "the desert",
    "birds",
    "a good book",
]
CATEGORIES = [
    "fruits",
    "colors",
    "animals",
    "vegetables",
    "countries in Europe",
    "musical instruments",
    "sports",
    "programming languages",
    "flowers",
    "kitchen tools",
]
WORDS = ["happy", "big", "fast", "smart", "cold", "quiet", "strong", "bright", "small", "easy"]
THINGS = [
    "computer",
    "volcano",
    "battery",
    "telescope",
    "vaccine",
    "rainbow",
    "compass",
    "bridge",
    "thermometer",
    "map",
]


def items() -> list[dict[str, object]]:
    rng = random.Random(31)
    out: list[dict[str, object]] = []

    def add(kind: str, prompt: str, answer: str | None = None) -> None:
        row: dict[str, object] = {"id": f"{kind}-{len(out):03d}", "prompt": prompt}
        if answer is not None:
            row["answer"] = answer
        out.append(row)

    for _ in range(40):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        add("add", f"What is {a} + {b}? Reply with the number only.", str(a + b))
    for _ in range(30):
        a, b = rng.randint(20, 99), rng.randint(1, 19)
        add("sub", f"What is {a} - {b}? Reply with the number only.", str(a - b))
    for _ in range(30):
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        add("mul", f"What is {a} times {b}? Reply with the number only.", str(a * b))
    for country, capital in CAPITALS.items():
        add("capital", f"What is the capital of {country}?", capital)
    for question, answer in FACTS:
        add("fact", question, answer)
    for topic in TOPICS:
        add("write", f"Write one sentence about {topic}.")
    for cat in CATEGORIES:
        add("list", f"List three {cat}.")
    for word in WORDS:
        add("synonym", f"Give a synonym for the word '{word}'.")
        add("antonym", f"What is the opposite of '{word}'?")
    for thing in THINGS:
        add("explain", f"Explain in one sentence what a {thing} is.")
    for topic in TOPICS:
        add("tips", f"Give two short tips about {topic}.")
    for _ in range(40):
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)
        add(
            "story",
            f"Tom has {a} boxes with {b} apples in each box. He eats {c} apples. "
            "How many apples are left? Reply with the number only.",
            str(a * b - c),
        )
    return out


def main() -> None:
    rows = items()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} items -> {OUT}")


if __name__ == "__main__":
    main()
