"""What the driver and the tasks of one micro-batch tell each other, as typed, frozen contracts.

This package sits below ``engine/``, ``adjunct/`` and ``standby/`` (each may import it, it imports none
of them): ``contracts.py`` (the specs shipped to tasks, the batch's plan, a task's result, all plain
JSON), ``steps.py`` (the interfaces of a per-batch feature, its driver step and its task step),
``jvm.py`` (the one seam to Spark's JVM) and ``executor.py`` (where a task runs).
"""
