# A generator-heavy CPython workload: every item passes through a chain of generators, so the
# interpreter resumes generators millions of times a second. On 3.11 each resumption is a
# native _PyEval_EvalFrameDefault call of its own (gen_send_ex2), whose entry and exit the
# agent's samples often land in. Runs for argv[1] seconds (default 60); prints "ready" first.
import sys
import time

stop_at = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 60)


def numbers(n):
    for i in range(n):
        yield i


def squares(src):
    for x in src:
        yield x * x


def evens(src):
    for x in src:
        if x % 2 == 0:
            yield x


def pipeline():
    return sum(evens(squares(numbers(10000))))


def genexpr():
    return sum(x * 3 for x in range(10000))


print('ready', flush=True)
while time.monotonic() < stop_at:
    pipeline()
    genexpr()
