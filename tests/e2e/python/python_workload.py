# The Python e2e test's workload: two threads whose functions measure their own CPU time
# (time.thread_time) and print the running totals every 0.2 s, so the test can compare each
# function's share of the profile with the share the workload measured in the same window.
#   main thread:  chain_outer -> chain_middle -> deep_leaf, then a generator (squares)
#                 consumed by consume_squares
#   worker thread: an asyncio event loop running the coroutine crunch, and plain_work called
#                 from the coroutine worker_main
# Each unit of work lasts 50 to 150 ms of CPU: the agent reads a thread's Python frames a few
# milliseconds after its sample, and a read that lands in another call is only wrong where
# the calls are shorter than that delay.
import asyncio
import sys
import threading
import time

WORK = {'deep_leaf': 2_400_000, 'squares': 1_200_000, 'crunch': 1_800_000, 'plain_work': 1_000_000}
acct = {name: 0.0 for name in WORK}
stop_at = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 120)


def deep_leaf():
    t0 = time.thread_time()
    x = 0
    for i in range(WORK['deep_leaf']):
        x += i * i
    acct['deep_leaf'] += time.thread_time() - t0
    return x


def chain_middle():
    return deep_leaf()


def chain_outer():
    return chain_middle()


def squares():
    while True:
        t0 = time.thread_time()
        x = 0
        for i in range(WORK['squares']):
            x += i * i
        acct['squares'] += time.thread_time() - t0
        yield x


def consume_squares(gen, items):
    total = 0
    for _ in range(items):
        total += next(gen)
    return total


def main_thread():
    gen = squares()
    while time.monotonic() < stop_at:
        chain_outer()
        consume_squares(gen, 2)


async def crunch():
    t0 = time.thread_time()
    x = 0
    for i in range(WORK['crunch']):
        x += i * i
    acct['crunch'] += time.thread_time() - t0
    await asyncio.sleep(0)
    return x


def plain_work():
    t0 = time.thread_time()
    x = 0
    for i in range(WORK['plain_work']):
        x += i * i
    acct['plain_work'] += time.thread_time() - t0
    return x


async def worker_main():
    while time.monotonic() < stop_at:
        await crunch()
        plain_work()


def worker():
    asyncio.run(worker_main())


def report():
    # The process's CPU time (every thread's): what the profile's samples add up to.
    fields = ' '.join(f'{k}={v:.6f}' for k, v in list(acct.items()) +
                      [('process', time.process_time())])
    print('acct', fields, flush=True)


t = threading.Thread(target=worker, name='worker', daemon=True)
t.start()
reporter_done = threading.Event()


def reporter():
    while not reporter_done.wait(0.2):
        report()


# The reporter sleeps between reports: its CPU is negligible.
threading.Thread(target=reporter, daemon=True).start()
print('ready', flush=True)
main_thread()
t.join()
reporter_done.set()
report()
print('done', flush=True)
