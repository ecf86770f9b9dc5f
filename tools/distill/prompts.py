"""The prompts whose answers the draft learns from.

No text corpus ships with the project apart from the held-out evaluation
text, so the target writes its own: first short passages on varied topics,
then summaries, rewrites and edits of those passages — what chat and
editing traffic looks like, and what speculative decoding serves best.
"""

import random

TOPICS = (
    "a lighthouse keeper",
    "the history of bread",
    "how rain forms",
    "a city at night",
    "learning to play the piano",
    "the first trip to the moon",
    "a busy train station",
    "how bees make honey",
    "an old bookshop",
    "the rules of chess",
    "a mountain village",
    "how computers store numbers",
    "a rainy afternoon",
    "the life of a river",
    "planting a vegetable garden",
    "a market in the morning",
    "how volcanoes erupt",
    "a letter to a friend",
    "the invention of the printing press",
    "a storm at sea",
    "training for a marathon",
    "the solar system",
    "a school science fair",
    "how vaccines work",
    "a dog that finds its way home",
    "the water cycle",
    "a winter festival",
    "how bridges stand",
    "a small bakery",
    "the migration of birds",
    "cooking a simple soup",
    "a museum visit",
    "how the internet works",
    "a forest after a fire",
    "the Roman empire",
    "a job interview",
    "recycling plastic",
    "a football match",
    "how plants make food",
    "a family dinner",
    "the Great Wall of China",
    "saving money",
    "a desert journey",
    "how clocks keep time",
    "a concert in the park",
    "the discovery of electricity",
    "a lost umbrella",
    "ocean tides",
    "writing a good email",
    "a village well",
    "how maps are made",
    "the northern lights",
    "a robot that learns to paint",
    "the history of tea",
    "a quiet library",
    "earthquakes",
    "starting a small business",
    "a garden in spring",
    "how airplanes fly",
    "a fishing trip",
)
PASSAGE_TASKS = (
    "Write a short paragraph about {}.",
    "Describe {} in a few sentences.",
    "Tell a short story about {}.",
    "Explain {} to a beginner.",
    "Write a few facts about {}.",
)
EDIT_TASKS = (
    "Summarize the following text in two sentences.",
    "Rewrite the following text in simpler words.",
    "Correct any mistakes in the following text and return the corrected text.",
    "Rewrite the following text in the past tense.",
    "Make the following text more formal.",
    "Turn the following text into a bulleted list of its main points.",
    "Repeat the following text, replacing every name with a different one.",
    "Give the following text a title, then repeat the text below it.",
)


def passage_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(f"{seed}/passages")
    return [rng.choice(PASSAGE_TASKS).format(rng.choice(TOPICS)) for _ in range(count)]


def edit_prompts(passages: list[str], per_passage: int, seed: int) -> list[str]:
    rng = random.Random(f"{seed}/edits")
    return [
        f"{task}\n\n{passage}"
        for passage in passages
        for task in rng.sample(EDIT_TASKS, per_passage)
    ]
