"""Prompt pools for the simulated user: short everyday questions, split into train and held-out.

The train pool feeds conversations (what the model learns from); the held-out pool is only ever
answered in measurement passes, so the adoption curve shows generalization, not memorization.
Questions are deliberately open ("how do I ...") so that the default model's untrained answers are
long (~120 words on average), which is what makes the "under 40 words" preference a real change.
"""

from __future__ import annotations

TRAIN_PROMPTS: tuple[str, ...] = (
    "How do I boil an egg?",
    "What is a good way to fall asleep faster?",
    "How can I keep my houseplants alive?",
    "What should I pack for a weekend trip?",
    "How do I make a cup of tea?",
    "How can I save money on groceries?",
    "What is a healthy breakfast?",
    "How do I clean a cast iron pan?",
    "How can I stay focused while studying?",
    "What are some tips for running in the rain?",
    "How do I start learning to cook?",
    "How can I make my morning routine easier?",
    "What is a good way to remember names?",
    "How do I remove a coffee stain from a shirt?",
    "How can I drink more water during the day?",
    "What should I do if my phone gets wet?",
    "How do I write a thank-you note?",
    "How can I make my bike last longer?",
    "What is a simple way to start meditating?",
    "How do I keep bread fresh longer?",
    "How can I reduce stress after work?",
    "What is a good gift for a new neighbor?",
    "How do I prepare for a job interview?",
    "How can I organize my closet?",
    "What should I do to prepare for a long flight?",
    "How do I make rice on the stove?",
    "How can I be more productive in the morning?",
    "What is the best way to learn a new language?",
    "How do I change a flat tire on a bike?",
    "How can I make my apartment feel cozier?",
    "What are easy exercises I can do at home?",
    "How do I make a simple salad dressing?",
    "How can I stop procrastinating?",
    "What should I bring to a picnic?",
    "How do I take care of a new puppy?",
    "How can I make friends in a new city?",
    "What is a quick dinner I can cook tonight?",
    "How do I keep my laptop battery healthy?",
    "How can I improve my handwriting?",
    "What should I do on a rainy Sunday?",
    "How do I wash wool sweaters?",
    "How can I get better at public speaking?",
    "What is a good way to plan my week?",
    "How do I freeze fresh herbs?",
    "How can I keep my kitchen clean?",
    "What should I look for when buying running shoes?",
    "How do I make cold brew coffee?",
    "How can I spend less time on my phone?",
)

HELDOUT_PROMPTS: tuple[str, ...] = (
    "How do I make pancakes?",
    "How can I sleep better at night?",
    "What should I do to stay healthy in winter?",
    "How do I clean my windows without streaks?",
    "How can I learn to play the guitar?",
    "What is a good way to save for a vacation?",
    "How do I keep my cat entertained?",
    "How can I start a small vegetable garden?",
)

# For tuning (learning rate, batch size, ...): `--eval-prompts validation`. The held-out pool above
# only draws the reported curve, so no setting is chosen by looking at it.
VALIDATION_PROMPTS: tuple[str, ...] = (
    "How do I make a smoothie?",
    "How can I keep my desk tidy?",
    "What should I do before a long drive?",
    "How do I polish leather shoes?",
    "How can I get better at drawing?",
    "What is a good way to pay off a small debt?",
    "How do I keep my dog calm during fireworks?",
    "How can I grow herbs on a windowsill?",
)

# Exclusive by construction; tests assert it.
assert not set(TRAIN_PROMPTS) & set(HELDOUT_PROMPTS)
assert not (set(TRAIN_PROMPTS) | set(HELDOUT_PROMPTS)) & set(VALIDATION_PROMPTS)

# The system prompt the simulated OpenClaw sends (OpenClaw's real one is 22-41 KB; a CPU run keeps
# it short). Measurement passes use the same one, so train and held-out contexts match.
SYSTEM_PROMPT = "You are a helpful assistant."
