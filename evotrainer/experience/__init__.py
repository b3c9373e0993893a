"""Self-navigating: an experience pool of lessons distilled from stored rollouts, retrieved by
embedding similarity into a share of training prompts and stripped again before the loss."""

from evotrainer.experience.distill import (
                                           LessonDraft,
                                           distill_store,
                                           get_distiller,
                                           lesson_id,
                                           register_distiller,
                                           training_groups,
)
from evotrainer.experience.pool import ExperiencePool, Hit, Lesson

__all__ = ["LessonDraft", "distill_store", "get_distiller", "lesson_id", "register_distiller",
           "training_groups", "ExperiencePool", "Hit", "Lesson"]
