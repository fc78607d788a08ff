"""The image classifier under multi_worker (Keras 3, tf-keras): one job, crashed and restarted.

Each topology's job runs once (a module-scoped fixture: tests/conftest.py keeps this module on
one pytest-xdist worker) and two tests read it: every process exits after epoch 2's backup, the
launcher restarts the whole job once, and ``fit`` continues at epoch 3 of the default 8. One test
checks the 95% the example promises, the other the restart. ParameterServer and Horovod:
``test_example_restarts_ps_horovod.py``; the other topologies: ``test_examples.py``.
"""

from __future__ import annotations

import pytest

from tests.examples.example_jobs import (
    RestartedJob,
    assert_reaches_95_percent,
    assert_resumed_from_backup,
    restarted_image_classifier,
)

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RestartedJob:
    return restarted_image_classifier(request, tmp_path_factory)


@pytest.mark.parametrize("job", ["multi_worker", pytest.param(
    "multi_worker_tf_keras", marks=pytest.mark.slow)], indirect=True)
def test_image_classifier_reaches_95_percent(job):
    assert_reaches_95_percent(job)


@pytest.mark.slow
@pytest.mark.parametrize("job", ["multi_worker", "multi_worker_tf_keras"], indirect=True)
def test_fit_resumes_from_backup_after_a_gang_restart(job):
    assert_resumed_from_backup(job)
