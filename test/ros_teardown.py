"""Teardown shared by the tests' probe nodes: subprocesses killed, executor and node gone."""


def shut_down(processes, executor, thread, node, context) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    executor.shutdown(timeout_sec=2)
    thread.join(5)
    node.destroy_node()
    context.try_shutdown()
    assert not thread.is_alive()
