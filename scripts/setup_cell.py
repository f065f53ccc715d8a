# 环境准备：本地已装好 attn_lib 时这一格只把图设成两倍像素，不装任何东西、不打印；在 Colab、魔搭 ModelScope 等新环境里安装 attn_lib（中文字体随库附带），先打印「正在安装……」，装好后在同一行接上「完成」。
import importlib.metadata, importlib.util, os, pathlib, re, subprocess, sys
TORCH_MIN = "2.5"  # 本书需要的最低 torch 版本（与 pyproject.toml 一致）
if importlib.util.find_spec("attn_lib") is None:
    try:
        _torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        _torch = None  # 没有 torch：pip 会按 attn_lib 的要求装上
    if _torch and [int(p) for p in re.findall(r"\d+", _torch)[:2]] < [int(p) for p in TORCH_MIN.split(".")]:
        raise RuntimeError(f"本书需要 torch {TORCH_MIN} 或更新的版本，这里是 {_torch}。"
                           f"请运行 pip install -U \"torch>={TORCH_MIN}\"，然后重启内核再运行这一格。")
    # 在本仓库的克隆里（魔搭 ModelScope：先 git clone 再打开章节）就从克隆安装，不必访问 GitHub；
    # pip 自己读取 PIP_INDEX_URL（镜像），已有的 torch 满足要求时原样保留。
    _clone = next((p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
                   if (p / "attn_lib" / "__init__.py").is_file() and (p / "pyproject.toml").is_file()), None)
    _source = os.environ.get("ATTN_LIB_SOURCE") or (str(_clone) if _clone else
                                                     "git+https://github.com/attn-book/attention-chapter")
    print(f"正在安装 attn_lib 及其依赖（来自 {_source}，含中文字体）……", end="", flush=True)  # 安装要一会儿，先说一声
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", _source], check=True)
    importlib.invalidate_caches()
    try:
        print(f"完成（attn_lib {importlib.metadata.version('attn-lib')}）")
    except importlib.metadata.PackageNotFoundError:
        print("完成")
try:  # 图按两倍像素保存，高分屏上也清晰（不在 Jupyter / Colab 里运行时跳过）
    get_ipython().run_line_magic("config", "InlineBackend.figure_formats = ['retina']")
except NameError:
    pass
