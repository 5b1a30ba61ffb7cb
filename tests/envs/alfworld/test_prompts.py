from envs.alfworld.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE


def test_templates_take_the_protocol_fields():
    first = FIRST_PROMPT_TEMPLATE.format(
        task="put a mug in cabinet",
        step=0,
        observation="You are in the middle of a room.",
        admissible_actions="go to cabinet 1\nlook",
    )
    assert "put a mug in cabinet" in first and "go to cabinet 1\nlook" in first
    assert "<think>" in first and "<action>" in first
    later = PROMPT_TEMPLATE.format(
        task="put a mug in cabinet",
        step=3,
        history_length=2,
        history="[obs] ... [action] look",
        observation="Nothing happens.",
        admissible_actions="look",
    )
    assert "[action] look" in later and "Nothing happens." in later and "3 steps" in later
