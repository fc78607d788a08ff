"""The local runner: a job's processes on this machine (`tasks.LocalTasks`), in a private
network namespace where allowed (`netns`)."""
