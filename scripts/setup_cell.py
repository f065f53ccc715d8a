# 环境准备:本地已装好 attn_lib 时这一格什么也不做;在 Colab 等新环境里安装 attn_lib 和中文字体。
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("attn_lib") is None:
    _source = os.environ.get("ATTN_LIB_SOURCE", "git+https://github.com/attn-book/attention-chapter")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", _source], check=True)
    if "google.colab" in sys.modules:
        subprocess.run("apt-get -qq install -y fonts-noto-cjk > /dev/null", shell=True, check=False)
try:  # 图按两倍像素保存,高分屏上也清晰(不在 Jupyter / Colab 里运行时跳过)
    get_ipython().run_line_magic("config", "InlineBackend.figure_formats = ['retina']")
except NameError:
    pass
