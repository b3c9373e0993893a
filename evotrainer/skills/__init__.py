"""The skill library: shipped interventions (`skills/`) plus those a workspace learned.

    lib = SkillLibrary.load(workdir)
    for skill in lib.filter(domain="math"):
        if skill.triggered(report):
            for params in skill.grid_points():
                edits = skill.render(harness_sources, params)   # {file: new full text}
"""

from evotrainer.skills.library import (
    STATUSES,
    Edit,
    Skill,
    SkillError,
    SkillLibrary,
    Trigger,
    parse_skill,
    save_learned,
    set_yaml_key,
    strip_block,
)

__all__ = ["STATUSES", "Edit", "Skill", "SkillError", "SkillLibrary", "Trigger", "parse_skill",
           "save_learned", "set_yaml_key", "strip_block"]
