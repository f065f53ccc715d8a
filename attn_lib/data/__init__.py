"""第 8–13 章（随包附带的数据）：测量好的基准表、多种子实验的结果和中文字体子集。

``tables`` loads the JSON files beside it; ``fonts/`` holds the bundled CJK font and its license.
"""
