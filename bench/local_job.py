"""One job on a fresh local cluster, for the benches that run jobs end to
end: `fulcrum local up`, submit the spec, wait for the end, read the job's
status as JSON, `fulcrum local down` (also on failure)."""
import json
import os
import shutil
import subprocess
import tempfile


def run(cmd):
    """A command's stdout; RuntimeError naming it and its stderr if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError('%s: exit %d: %s' % (' '.join(cmd), done.returncode, done.stderr.strip()))
    return done.stdout


def run_job(fulcrum, spec_text, servers, workers, prefix='fulcrum-bench-'):
    """The final status (`fulcrum get -o json`) of the job `spec_text` (YAML
    or JSON) on a fresh cluster of `servers` servers and `workers` workers;
    RuntimeError unless it SUCCEEDED."""
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        run([fulcrum, 'local', 'up', '--servers', str(servers), '--workers', str(workers), '--dir', work,
             '--detach'])
        spec_path = os.path.join(work, 'spec.yaml')
        with open(spec_path, 'w') as f:
            f.write(spec_text)
        job = run([fulcrum, 'submit', '-f', spec_path, '--dir', work]).strip()
        subprocess.run([fulcrum, 'watch', job, '--dir', work], capture_output=True)
        status = json.loads(run([fulcrum, 'get', job, '-o', 'json', '--dir', work]))
        if status['state'] != 'SUCCEEDED':
            raise RuntimeError('%d servers, %d workers: %s: %s' % (servers, workers, status['state'],
                                                                   status.get('reason')))
        return status
    finally:
        subprocess.run([fulcrum, 'local', 'down', '--dir', work], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
