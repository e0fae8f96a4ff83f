"""Writes wheels/forkd_demo-1.0-py3-none-any.whl, the local wheel the python-data recipe installs with its pip step
(so the recipe shows a requirements file installed from a local directory, with nothing from the network).
Run from this directory with any python3: python3 make-wheel.py"""
import base64
import hashlib
import zipfile

NAME, VERSION = "forkd_demo", "1.0"
FILES = {
    f"{NAME}/__init__.py": 'GREETING = "hello from a local wheel"\n\n\ndef describe(frame):\n'
    '    return f"{len(frame)} rows, columns {list(frame.columns)}"\n',
    f"{NAME}-{VERSION}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: forkd-demo\nVersion: {VERSION}\n",
    f"{NAME}-{VERSION}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: make-wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


record_path = f"{NAME}-{VERSION}.dist-info/RECORD"
with zipfile.ZipFile(f"wheels/{NAME}-{VERSION}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as whl:
    record = ""
    for path, text in FILES.items():
        data = text.encode()
        info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        whl.writestr(info, data)
        record += record_line(path, data)
    record += f"{record_path},,\n"
    info = zipfile.ZipInfo(record_path, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    whl.writestr(info, record)
