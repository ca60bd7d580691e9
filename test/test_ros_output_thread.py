"""ros/output_thread.py: image-sized messages beside the frame loop, never blocking it."""
import threading

from lingbot_ros.ros.output_thread import MAX_WAITING, OutputThread


def test_jobs_run_in_order_and_stop_finishes_what_was_queued():
    done, errors = [], []
    thread = OutputThread(errors.append)
    for i in range(MAX_WAITING):
        thread.submit(lambda i=i: done.append(i))
    assert thread.stop(timeout=5)
    assert done == list(range(MAX_WAITING)) and not errors
    thread.submit(lambda: done.append("late"))   # after stop: dropped, never run, no error
    assert done == list(range(MAX_WAITING))


def test_a_slow_subscriber_skips_the_oldest_frames_and_never_blocks_the_submitter():
    release, started, done = threading.Event(), threading.Event(), []
    thread = OutputThread(lambda error: None)

    def slow():
        started.set()
        release.wait(5)
        done.append("slow")
    thread.submit(slow)
    assert started.wait(5)
    for i in range(MAX_WAITING + 3):            # the thread is busy: these queue, oldest skipped
        thread.submit(lambda i=i: done.append(i))
    assert thread.skipped == 3
    release.set()
    assert thread.stop(timeout=5)
    assert done == ["slow", 3, 4]


def test_a_failing_job_is_reported_and_the_thread_goes_on():
    errors, done = [], []
    thread = OutputThread(errors.append)
    thread.submit(lambda: 1 / 0)
    thread.submit(lambda: done.append("next"))
    assert thread.stop(timeout=5)
    assert [type(e) for e in errors] == [ZeroDivisionError] and done == ["next"]
