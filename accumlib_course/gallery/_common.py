"""What every gallery loop is written for: ``K`` micro-batches per step, a clip that really clips."""

K = 4  # the accumulation every loop in the gallery is written for
CLIP = 0.1  # small enough that every window of the tiny MLP is really clipped
