import subprocess, sys
def test_race(postgres_url):
    code = "import sys; from autotune.study import open_storage; open_storage(sys.argv[1]); print('ok')"
    ps = [subprocess.Popen([sys.executable, "-c", code, postgres_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate() for p in ps]
    print(outs)
    assert all(p.returncode == 0 for p in ps), outs
